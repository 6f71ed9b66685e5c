"""The live connection as the page shows it, in a real browser (Chromium, Daphne, PostgreSQL, Redis): a
connection that went silent without closing is not shown as "Live"; a decided card folds only once nothing
the reviewer points at or has focused would move; presence whose notice was missed is put right; a page
whose session ended while its socket was down goes to the sign-in page."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.test import Client
from playwright.sync_api import expect

from approvals.models import Membership, ToolCall
from approvals.services import answers, presence
from tests import factories
from tests.browser.conftest import reload_live, wait_live
from tests.live import wait_until

pytestmark = pytest.mark.timeout(120)


def _top(card: Any) -> float:
    """Where the card is on the screen, read in one step in the page: the resync after the socket opened
    may redraw the card at any moment (in place), and a measure made of two steps (`bounding_box`: find the
    element, then measure it) finds no box when the element it found was replaced in between."""
    return card.evaluate("(el) => el.getBoundingClientRect().top")


def _until(page: Any, condition: Any, what: str) -> None:
    """Wait, letting the browser's events (its sockets, routed through the test) reach the test, until
    ``condition()`` holds."""
    for _ in range(150):
        if condition():
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"timed out waiting for {what}")


# The page's sockets as the page itself sees them: how many it made, how many pongs it heard (counted by a
# listener the socket holds before the page's own: by the time the count moves, the page has heard it too).
COUNT_SOCKETS = """(() => {
  const Native = window.WebSocket;
  window.__sockets = 0;
  window.__pongs = 0;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      window.__sockets += 1;
      this.addEventListener("message", (e) => {
        if (String(e.data).includes('"pong"')) window.__pongs += 1;
      });
    }
  };
})();"""


def test_a_connection_that_went_silent_without_closing_is_given_up_and_made_again(web: Any, new_page) -> None:
    factories.user("alice")
    page = new_page("alice")
    line = {"silent": False, "opened": 0}

    def route(ws: Any) -> None:
        # The hub's side stays open and answers; what it says reaches the page only while the line is good.
        server = ws.connect_to_server()
        line["opened"] += 1
        server.on_message(lambda message: None if line["silent"] else ws.send(message))

    page.route_web_socket(re.compile(r"/ws/"), route)
    page.clock.install()
    page.reload()
    wait_live(page)
    region = page.locator("#live-status [role=status]")
    expect(region).to_have_text("Live")

    line["silent"] = True  # no close, no error: the pongs just stop coming
    page.clock.run_for(40_000)
    expect(page.locator("#live-status")).to_have_attribute("data-state", "down")
    expect(region).to_have_text(re.compile("Reconnecting"))
    expect(page.locator("#live-status [data-live-ago]")).to_contain_text("Updated")
    _until(page, lambda: line["opened"] >= 2, "a new socket")

    line["silent"] = False  # the new socket opened on the dead line never said hello: it is given up too
    page.clock.run_for(40_000)
    wait_live(page)
    expect(region).to_have_text("Live")


def test_a_connection_whose_pings_are_answered_stays_live_when_its_timers_run_once_a_minute(
    web: Any, new_page
) -> None:
    """A hidden tab's timers may run once a minute: the time between pings is no silence."""
    factories.user("alice")
    page = new_page("alice")
    page.add_init_script(COUNT_SOCKETS)
    page.clock.install()
    page.reload()
    wait_live(page)
    for _ in range(4):
        pongs = page.evaluate("window.__pongs")
        page.clock.fast_forward(60_000)  # one tick: a ping goes out
        # and its pong comes back, however long that takes, before the next tick looks for it
        page.wait_for_function("(pongs) => window.__pongs > pongs", arg=pongs)
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    assert page.evaluate("window.__sockets") == 1  # never given up and made again


@pytest.fixture
def two_rounds(web: Any) -> list[Any]:
    """alice and bob review for release; two running calls wait on them, the older first on the page."""
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    requests = []
    for tool in ("create_deployment", "restart_service"):
        call = factories.call(deploy, tool=tool)
        ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.RUNNING)
        requests.append(factories.open_round(call, team_=release).input_requests.get())
    return requests


def test_a_card_decided_elsewhere_does_not_fold_from_under_the_pointer(two_rounds, new_page) -> None:
    first, second = two_rounds
    page = new_page("alice")
    page.clock.install()
    reload_live(page)  # the list the page reads on hello was drawn before the decision below
    older, newer = page.locator(f"#round-{first.round_id}"), page.locator(f"#round-{second.round_id}")
    expect(newer).to_be_visible()
    newer.locator("[data-open]").hover()  # about to click the newer round's request
    top = _top(newer)

    bob = first.team.memberships.get(user__username="bob").user
    answers.input_respond(input_request_id=first.pk, user=bob, action="decline", reason="not now")
    expect(older).to_have_class(re.compile(r"\bis-done\b"))  # greyed, with who decided
    expect(older).to_contain_text("Declined by bob")
    page.clock.run_for(10_000)
    expect(older).to_have_count(1)  # still there: the row under the pointer has not moved
    assert _top(newer) == top

    page.mouse.move(5, 5)  # the pointer goes elsewhere: the decided card folds away
    page.clock.run_for(3_000)
    expect(older).to_have_count(0)
    expect(newer).to_be_visible()


def test_a_card_decided_elsewhere_does_not_fold_from_above_the_keyboard_focus(two_rounds, new_page) -> None:
    first, second = two_rounds
    page = new_page("alice")
    page.clock.install()
    reload_live(page)  # the list the page reads on hello was drawn before the decision below
    page.mouse.move(5, 5)
    older, newer = page.locator(f"#round-{first.round_id}"), page.locator(f"#round-{second.round_id}")
    newer.locator("[data-open]").focus()  # reached with the keyboard, below the card about to be decided
    top = _top(newer)

    bob = first.team.memberships.get(user__username="bob").user
    answers.input_respond(input_request_id=first.pk, user=bob, action="decline", reason="not now")
    expect(older).to_have_class(re.compile(r"\bis-done\b"))
    page.clock.run_for(10_000)
    expect(older).to_have_count(1)  # the focused row below it has not moved
    assert _top(newer) == top

    page.evaluate("() => document.activeElement.blur()")
    page.clock.run_for(3_000)
    expect(older).to_have_count(0)  # once the focus is elsewhere it folds, not left greyed for good


def test_a_presence_change_whose_notice_the_page_never_heard_is_put_right_within_a_beat(
    two_rounds, new_page
) -> None:
    first, _second = two_rounds
    page = new_page("alice")
    page.clock.install()
    page.goto(f"/requests/{first.pk}/")
    wait_live(page)
    slot = page.locator(f"[data-presence-for='{first.pk}']")
    expect(slot).to_have_text("")

    key = presence._key(first.pk)
    wait_until(lambda: "alice" in presence.viewers([first.pk]).get(str(first.pk), []), 15, what="her beat")

    # bob opened the request while alice's socket was down: his notice never reached her page.
    presence._client().hset(key, "bob", time.time() + presence.PRESENCE_TTL)
    page.clock.run_for(11_000)  # one beat (hers changes nothing: no notice goes out)
    expect(slot).to_contain_text("Being looked at by bob")

    # He left the same way (no word reached the page): gone again at the next beat.
    presence._client().hdel(key, "bob")
    page.clock.run_for(11_000)
    expect(slot).to_have_text("")


def test_a_page_whose_session_ended_while_its_socket_was_down_goes_to_the_sign_in_page(
    two_rounds, new_page
) -> None:
    first, _second = two_rounds
    page = new_page("alice")
    line = {"down": False, "open": []}

    def route(ws: Any) -> None:
        if line["down"]:
            ws.close()
            return
        ws.connect_to_server()
        line["open"].append(ws)

    page.route_web_socket(re.compile(r"/ws/"), route)
    page.reload()
    wait_live(page)
    line["down"] = True
    for ws in line["open"]:
        ws.close()
    page.wait_for_selector("#live-status[data-state='down']")

    elsewhere = Client()  # signed out elsewhere meanwhile: no socket of the page hears of it
    elsewhere.cookies["sessionid"] = next(c for c in page.context.cookies() if c["name"] == "sessionid")[
        "value"
    ]
    assert elsewhere.post("/accounts/logout/").status_code == 302
    line["down"] = False

    page.wait_for_url(re.compile(r"/accounts/login/"), timeout=30_000)  # not "Reconnecting..." for good
    expect(page.locator(f"[data-request='{first.pk}']")).to_have_count(0)
