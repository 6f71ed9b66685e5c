"""The live queue page in a real browser (Chromium, Daphne, PostgreSQL, Redis): a card redrawn under the
keyboard focus keeps it; a page whose session ended elsewhere leaves what it showed for the sign-in page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from playwright.sync_api import expect

from approvals.models import Membership, ToolCall
from approvals.services import sending
from tests import factories
from tests.browser import conftest as browser_fixtures
from tests.browser.conftest import browser, reload_live, wait_live  # noqa: F401  (fixtures: used by name)

new_page = browser_fixtures.new_page  # the fixture, by its name

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running_request(web: Any) -> Any:
    """alice reviews for release; a running call of its server asks her team one question."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    call = factories.call(deploy, tool="create_deployment")
    rnd = factories.open_round(call, team_=release)
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.RUNNING)
    return rnd.input_requests.get()


def test_a_card_redrawn_under_the_keyboard_focus_keeps_it(running_request, new_page) -> None:
    ir = running_request
    page = new_page("alice")
    # Once the list the page reads on hello is drawn: redrawn by it after being marked below, the card would
    # be new and keep the focus without any notice.
    reload_live(page)
    link = page.locator(f"[data-request='{ir.pk}'] [data-open]")
    link.focus()
    page.locator(f"#round-{ir.round_id}").evaluate("(card) => { card.dataset.old = '1'; }")

    progress = {"progress": 3, "total": 8, "message": "copying", "at": "2026-01-01T00:00:00Z"}
    assert sending.call_progress(call_id=ir.round.call_id, progress=progress)
    card = page.locator(f"#round-{ir.round_id}")
    expect(card.locator("[data-call-progress]")).to_contain_text("3 of 8")
    assert card.get_attribute("data-old") is None  # redrawn: a new element
    focused = page.evaluate(
        "() => { const a = document.activeElement;"
        " return a.matches('[data-open]') ? a.closest('[data-request]').dataset.request : a.tagName; }"
    )
    assert focused == str(ir.pk)


def test_a_page_whose_session_ended_elsewhere_goes_to_the_sign_in_page(running_request, new_page) -> None:
    page = new_page("alice")
    wait_live(page)
    expect(page.locator(f"[data-request='{running_request.pk}']")).to_be_visible()

    elsewhere = Client()
    session = next(c for c in page.context.cookies() if c["name"] == "sessionid")
    elsewhere.cookies["sessionid"] = session["value"]
    assert elsewhere.post("/accounts/logout/").status_code == 302

    page.wait_for_url(re.compile(r"/accounts/login/"), timeout=30_000)  # at the socket's next ping
    expect(page.locator(f"[data-request='{running_request.pk}']")).to_have_count(0)
