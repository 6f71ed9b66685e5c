"""A queue page's resync in a real browser (Chromium, Daphne, PostgreSQL, Redis): the list the server draws
now is merged into the one shown. A card decided while the page heard nothing stays greyed with who decided;
a new card comes in at its place; the keyboard focus, the selection and what is in view stay; a card the
reviewer may no longer see leaves."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals import broadcast
from approvals.models import InputRequest, Membership, Round, ToolCall
from approvals.services import answers
from tests import factories
from tests.browser import conftest as browser_fixtures
from tests.browser.conftest import browser, reload_live  # noqa: F401  (fixtures: used by name)

new_page = browser_fixtures.new_page  # the fixture, by its name

pytestmark = pytest.mark.timeout(120)

# What a deaf line drops: every notice of a change (the pings' answers still come, so the page stays "Live").
NOTICES = {"card", "presence", "resync", "call"}


def _running_request(server: Any, tool: str, team: Any) -> InputRequest:
    call = factories.call(server, tool=tool)
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.RUNNING)
    return factories.open_round(call, team_=team).input_requests.get()


@pytest.fixture
def queue(web: Any) -> dict[str, Any]:
    """alice and bob review for release; three running calls wait on them, oldest first."""
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    requests = [_running_request(deploy, tool, release) for tool in ("create_deployment", "restart_service")]
    requests.append(_running_request(deploy, "rotate_keys", release))
    return {"alice": alice, "bob": bob, "release": release, "deploy": deploy, "requests": requests}


def _deaf_line(page: Any) -> dict[str, Any]:
    """The page's sockets go through here: while ``deaf``, the hub's notices never reach the page (a
    flaky network that lost them); ``resync()`` then tells the page to read its state again."""
    line: dict[str, Any] = {"deaf": False, "sockets": [], "dropped": []}

    def route(ws: Any) -> None:
        server = ws.connect_to_server()
        line["sockets"].append(ws)

        def relay(message: Any) -> None:
            kind = json.loads(message).get("type") if isinstance(message, str) else None
            if line["deaf"] and kind in NOTICES:
                line["dropped"].append(kind)
            else:
                ws.send(message)

        server.on_message(relay)

    line["resync"] = lambda: line["sockets"][-1].send(json.dumps({"type": "resync", "reason": "gap"}))
    page.route_web_socket(re.compile(r"/ws/"), route)
    return line


def _until_dropped(page: Any, line: dict[str, Any], cards: int) -> None:
    """Wait (pumping the browser's events) until the deaf line has dropped this many card notices."""
    for _ in range(150):
        if line["dropped"].count("card") >= cards:
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"the page's socket heard {line['dropped']}, not {cards} card notices")


def _rounds_in_order(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        "[data-queue-list] > .card", "(cards) => cards.map((c) => c.dataset.round)"
    )


def test_a_resync_keeps_decided_cards_greyed_and_brings_new_ones_in_place(queue, new_page) -> None:
    first, second, third = queue["requests"]
    page = new_page("alice", viewport={"width": 1000, "height": 520})
    line = _deaf_line(page)
    reload_live(page)
    assert _rounds_in_order(page) == [str(first.round_id), str(second.round_id), str(third.round_id)]

    # The reviewer moves to the second request by keyboard, with the page scrolled down a little.
    page.mouse.move(5, 5)
    page.keyboard.press("j")
    page.keyboard.press("j")
    row = page.locator(f"[data-request='{second.pk}']")
    expect(row).to_have_class(re.compile(r"\bis-selected\b"))
    page.evaluate("window.scrollTo(0, 120)")
    top = row.bounding_box()["y"]

    line["deaf"] = True
    answers.input_respond(input_request_id=first.pk, user=queue["bob"], action="decline", reason="not now")
    # A request older than the second one came to the team meanwhile (its place is between the first two),
    # and a newer one after the rest.
    between = _running_request(queue["deploy"], "scale_down", queue["release"])
    Round.objects.filter(pk=between.round_id).update(
        deadline=first.round.deadline + (second.round.deadline - first.round.deadline) / 2
    )
    newest = _running_request(queue["deploy"], "purge_cache", queue["release"])
    _until_dropped(page, line, 1)  # the decision's notice went by unheard
    page.wait_for_timeout(500)
    older = page.locator(f"#round-{first.round_id}")
    expect(older).not_to_have_class(re.compile(r"\bis-done\b"))

    line["deaf"] = False
    line["resync"]()

    # Decided meanwhile: still in its place, greyed, with who decided (it folds once nothing would move).
    expect(older).to_have_class(re.compile(r"\bis-done\b"))
    expect(older.locator(f"[data-request='{first.pk}']")).to_contain_text("Declined by bob")
    expect(page.locator(f"#round-{newest.round_id}")).to_have_count(1)
    assert _rounds_in_order(page) == [
        str(first.round_id),
        str(between.round_id),
        str(second.round_id),
        str(third.round_id),
        str(newest.round_id),
    ]
    # The focus and the selection stay on the second request; it has not moved on the screen.
    expect(row).to_have_class(re.compile(r"\bis-selected\b"))
    focused = page.evaluate(
        "() => { const a = document.activeElement;"
        " return a.matches('[data-open]') ? a.closest('[data-request]').dataset.request : a.tagName; }"
    )
    assert focused == str(second.pk)
    assert abs(row.bounding_box()["y"] - top) < 1
    expect(page.locator("[data-pending-count]")).to_have_text("4")
    expect(page.locator("[data-new-pill]")).to_be_visible()  # new requests out of view are counted

    page.wait_for_timeout(5000)  # past the fold's delay: the focus below keeps the decided card in place
    expect(older).to_have_count(1)
    assert abs(row.bounding_box()["y"] - top) < 1

    page.keyboard.press("j")  # the focus moves on; the decided card, above it, still waits
    page.locator("h1").click()  # the focus leaves the list: the decided card folds away
    expect(older).to_have_count(0, timeout=10_000)


def test_a_resync_drops_the_cards_the_reviewer_may_no_longer_see(queue, new_page) -> None:
    first = queue["requests"][0]
    alice = queue["alice"]
    ops = factories.team("ops", (alice, Membership.Role.REVIEWER))
    infra = factories.server("infra", name="Infra bot", default_team=ops)
    theirs = _running_request(infra, "drain_node", ops)
    page = new_page("alice")
    line = _deaf_line(page)
    reload_live(page)
    card = page.locator(f"#round-{theirs.round_id}")
    expect(card).to_be_visible()

    line["deaf"] = True
    Membership.objects.filter(team=ops, user=alice).delete()
    page.wait_for_timeout(500)
    line["deaf"] = False
    line["resync"]()

    expect(card).to_have_count(0)
    expect(page.locator(f"#round-{first.round_id}")).to_be_visible()
    expect(page.locator("[data-pending-count]")).to_have_text("3")


def test_a_resync_after_everything_was_decided_keeps_them_greyed_then_says_nothing_waits(
    queue, new_page
) -> None:
    page = new_page("alice")
    line = _deaf_line(page)
    reload_live(page)
    page.mouse.move(5, 5)
    line["deaf"] = True
    for ir in queue["requests"]:
        answers.input_respond(input_request_id=ir.pk, user=queue["bob"], action="cancel")
    _until_dropped(page, line, 3)
    expect(page.locator("[data-queue-list] > .card.is-done")).to_have_count(0)
    line["deaf"] = False
    line["resync"]()

    cards = page.locator("[data-queue-list] > .card")
    expect(cards).to_have_count(3)
    expect(page.locator("[data-queue-list] > .card.is-done")).to_have_count(3)
    expect(page.locator("[data-pending-count]")).to_have_text("0")
    expect(page.locator("[data-empty]")).to_have_count(0)  # not yet: the decided cards are still shown
    expect(cards).to_have_count(0, timeout=15_000)
    expect(page.locator("[data-empty]")).to_be_visible()


def test_a_list_that_crossed_newer_notices_on_a_slow_line_does_not_undo_them(queue, new_page) -> None:
    """The list is read, then a decision and a new round are heard, then the (older) list arrives: the
    decided card stays greyed and the new card stays."""
    first = queue["requests"][0]
    page = new_page("alice")
    line = _deaf_line(page)
    reload_live(page)
    page.mouse.move(5, 5)
    held: list[Any] = []

    def slow_line(route: Any) -> None:
        held.append((route, route.fetch()))  # read now, delivered late

    page.route(re.compile(r"/queue/list/"), slow_line)
    line["resync"]()
    for _ in range(100):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the page did not ask for its list"

    answers.input_respond(input_request_id=first.pk, user=queue["bob"], action="decline", reason="not now")
    older = page.locator(f"#round-{first.round_id}")
    expect(older).to_have_class(re.compile(r"\bis-done\b"))
    newest = _running_request(queue["deploy"], "purge_cache", queue["release"])
    broadcast.queue_changed("round.opened", newest.round.call_id, [newest])
    arrived = page.locator(f"#round-{newest.round_id}")
    expect(arrived).to_be_visible()

    route, response = held[0]
    route.fulfill(response=response)
    page.wait_for_timeout(1500)  # merged, and whatever it read afterwards answered
    expect(arrived).to_be_visible()
    expect(arrived).not_to_have_class(re.compile(r"\bis-done\b"))
    if older.count():  # it may have folded away by now; never pending again
        expect(older).to_have_class(re.compile(r"\bis-done\b"))
    expect(page.locator(f"[data-request='{first.pk}'][data-pending-request]")).to_have_count(0)
    expect(page.locator("[data-pending-count]")).to_have_text("3")
