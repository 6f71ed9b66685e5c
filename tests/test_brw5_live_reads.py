"""What a live page reads over HTTP, in a real browser (Chromium, Daphne, PostgreSQL, Redis): a read the hub
answered before a change, but that reaches the page after the change's own notice, does not undo it; on the
call page, and on a queue whose last card just folded away."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from approvals import broadcast
from approvals.models import InputRequest, Membership, ToolCall
from approvals.services import answers, sending
from tests import factories
from tests.browser import conftest as browser_fixtures
from tests.browser.conftest import browser, reload_live, wait_live  # noqa: F401  (fixtures: used by name)

new_page = browser_fixtures.new_page  # the fixture, by its name

pytestmark = pytest.mark.timeout(120)

# Counts the page's reads of an address holding ``path`` once the page has done with each (a task after the
# read's text came: every step the page chains on it has run by then).
COUNT_READS = """(path) => {
  window.__reads = 0;
  const get = window.fetch;
  window.fetch = (url, ...rest) => get(url, ...rest).then((response) => {
    if (!String(url).includes(path)) return response;
    const text = response.text.bind(response);
    response.text = () => text().then((body) => {
      window.setTimeout(() => { window.__reads += 1; });
      return body;
    });
    return response;
  });
}"""


def _held(page: Any, held: list[Any]) -> None:
    """Wait (letting the browser's events reach the test) until a read is held."""
    for _ in range(150):
        if held:
            return
        page.wait_for_timeout(100)
    raise AssertionError("no read was held")


@pytest.fixture
def running_call(web: Any) -> ToolCall:
    """alice reviews for release; a call of its server is running."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    call = factories.call(deploy, tool="create_deployment")
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.RUNNING)
    return call


def test_a_body_read_answered_before_a_progress_notice_does_not_undo_it(running_call, new_page) -> None:
    page = new_page("alice")
    page.add_init_script(f"({COUNT_READS})('/body/')")
    held: list[tuple[Any, Any]] = []
    # The read the page makes as its socket says hello is answered by the hub at once (before the progress
    # below), and reaches the page only once the progress's notice has.
    page.route(
        f"**{reverse('approvals:call_body', args=[running_call.pk])}",
        lambda route: held.append((route, route.fetch())),
    )
    page.goto(f"/calls/{running_call.pk}/")
    wait_live(page)
    body = page.locator(f"[data-call-page='{running_call.pk}']")
    expect(body).to_have_attribute("data-watching", "")  # the hub tells the page of the call's changes
    _held(page, held)

    progress = {"progress": 3, "total": 8, "message": "copying", "at": "2026-01-01T00:00:00Z"}
    assert sending.call_progress(call_id=running_call.pk, progress=progress)
    expect(body).to_contain_text("3 of 8")

    route, answered = held.pop()
    route.fulfill(response=answered)  # drawn before the progress
    page.wait_for_function("() => window.__reads >= 1")
    assert "3 of 8" in body.inner_text()


@pytest.fixture
def release(web: Any) -> SimpleNamespace:
    """alice and bob review for release, whose server is deploy."""
    alice, bob = factories.user("alice"), factories.user("bob")
    team = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    server = factories.server("deploy", name="Deploy bot", default_team=team)
    return SimpleNamespace(team=team, server=server, bob=bob)


def _running_request(release: SimpleNamespace, tool: str) -> InputRequest:
    call = factories.call(release.server, tool=tool)
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.RUNNING)
    return factories.open_round(call, team_=release.team).input_requests.get()


def test_a_card_that_comes_in_while_the_emptied_queue_is_read_stays(
    release: SimpleNamespace, new_page
) -> None:
    first = _running_request(release, "create_deployment")
    page = new_page("alice")
    reload_live(page)
    page.evaluate(COUNT_READS, "/queue/list/")
    page.mouse.move(5, 5)
    card = page.locator(f"#round-{first.round_id}")
    expect(card).to_be_visible()
    # The list the page reads once its last card is gone is answered by the hub at once (nothing waits), and
    # reaches the page only once a round opened meanwhile has come in by its notice.
    held: list[tuple[Any, Any]] = []
    page.route("**/queue/list/", lambda route: held.append((route, route.fetch())))

    answers.input_respond(input_request_id=first.pk, user=release.bob, action="decline", reason="not now")
    expect(card).to_have_count(0, timeout=20_000)  # greyed, then folded away
    _held(page, held)
    newer = _running_request(release, "restart_service")
    broadcast.queue_changed("round.opened", newer.round.call_id, [newer])
    newcard = page.locator(f"#round-{newer.round_id}")
    expect(newcard).to_be_visible()

    route, answered = held.pop()
    route.fulfill(response=answered)  # drawn before the round opened: nothing waits
    page.wait_for_function("() => window.__reads >= 1")
    assert newcard.count() == 1
    expect(newcard).to_be_visible()
    expect(page.locator("[data-queue-list] [data-empty]")).to_have_count(0)
    expect(page.locator("[data-pending-count]")).to_have_text("1")
