"""The reviewer dashboard in a real browser, on the whole stack: what a reviewer sees and what the MCP
server then receives."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.models import AgentClient, InputRequest, Membership, Round, Team, ToolCall
from approvals.services import answers, presence
from tests import demo_support, factories
from tests.browser.conftest import confirm_second_look, reload_live, screenshot, wait_live
from tests.hub import Hub
from tests.live import Daphne, child_env, wait_until

pytestmark = pytest.mark.timeout(120)

QUEUE_URL = re.compile(r"^http://127\.0\.0\.1:\d+/$")


def retries(demo_url: str) -> list[dict[str, Any]]:
    return [
        r["body"]["params"]["inputResponses"]
        for r in demo_support.recorded_requests(demo_url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]


def pending_request(call_id: str, key: str) -> InputRequest:
    return wait_until(  # type: ignore[return-value]
        lambda: InputRequest.objects.filter(round__call_id=call_id, key=key, status="pending").first(),
        30,
        what=f"input request {key} of {call_id}",
    )


# Counts the page's fetches of its whole list from here on (the one its socket's hello asked for is out
# already: the page says "Live" and reads in the same step).
COUNT_LIST_READS = (
    "() => { window.__lists = 0; const get = window.fetch; window.fetch = (url, ...rest) => {"
    " if (String(url).includes('/queue/list/')) window.__lists += 1; return get(url, ...rest); }; }"
)


def finished(call_id: str) -> ToolCall:
    # Not hub.agent.wait(): the long-poll waits through async_to_sync; Playwright's loop runs in this thread.
    return wait_until(  # type: ignore[return-value]
        lambda: ToolCall.objects.filter(pk=call_id, status="completed").first(), 30, what=f"call {call_id}"
    )


def field_error(page: Any, name: str) -> str:
    return page.locator(f"[data-field][data-name='f-{name}'] [data-field-error]").inner_text()


def test_a_new_call_appears_live_and_the_meeting_form_sends_typed_values(
    hub: Hub, new_page, demo_server
) -> None:
    page = new_page("alice")
    reload_live(page)  # the list read on hello is answered: the card can only come by its notice
    page.evaluate("window.__notReloaded = true")
    page.evaluate(COUNT_LIST_READS)

    call_id = hub.agent.call("schedule_meeting")
    card = page.locator(f"article.card[data-call='{call_id}']")
    card.wait_for(timeout=30_000)
    assert page.evaluate("window.__notReloaded") is True
    # Brought by its own notice on the socket as the round opened: neither a reload nor a read of the list.
    assert page.evaluate("window.__lists") == 0
    assert card.locator(".server-name").inner_text() == "Deploy bot"  # the hub's name, not serverInfo
    assert card.locator(".tool").inner_text() == "schedule_meeting"
    assert re.match(r"\(1\) Queue", page.title())
    assert page.get_by_text("Plan the meeting.").is_visible()
    screenshot(page, "queue")

    # Keyboard: j selects the first pending request, o opens it.
    page.keyboard.press("j")
    page.keyboard.press("o")
    page.wait_for_url(re.compile(r"/requests/"))
    form = page.locator("form[data-answer-form]")
    assert page.get_by_label("Title").input_value() == "Release review"  # default prefilled
    assert page.get_by_label("Expected attendees").input_value() == "4"
    assert page.locator("[data-field][data-name='f-room'] legend").inner_text() == "Room"
    assert page.locator("label", has_text="Agenda").inner_text() == "Agenda (optional)"
    assert page.locator("label", has_text="Organizer email").inner_text() == "Organizer email"
    assert page.get_by_label("Organizer email").get_attribute("type") == "email"
    assert page.get_by_label("Agenda").get_attribute("type") == "url"
    assert page.get_by_label("Date", exact=True).get_attribute("type") == "date"
    assert page.get_by_label("Starts at").get_attribute("type") == "datetime-local"
    assert page.get_by_label("Expected attendees").get_attribute("inputmode") == "numeric"
    assert page.get_by_label("Time zone for dates and times").input_value() == "Europe/Paris"
    assert page.get_by_label("roadmap", exact=True).is_checked()

    page.get_by_label("Title").fill("Release review 2.3")
    page.get_by_label("Organizer email").fill("ana@example.com")
    page.get_by_label("Agenda").fill("https://example.com/agenda")
    page.get_by_label("Date", exact=True).fill("2026-12-03")
    page.get_by_label("Starts at").fill("2026-12-03T10:30")
    page.get_by_label("Duration (hours)").fill("1.5")
    page.get_by_label("Expected attendees").fill("2o")
    page.get_by_label("Record the meeting").check()
    page.get_by_label("borealis").check()
    page.get_by_label("High").check()
    page.get_by_label("Paris (CET)").check()
    page.get_by_label("budget").check()
    page.get_by_label("Projector").check()
    page.get_by_label("Video conferencing").check()
    screenshot(page, "form")

    # The browser checks first: the error sits beside the field, the summary takes the focus.
    page.get_by_role("button", name=re.compile("Approve and send")).click()
    attendees = page.locator("[data-field][data-name='f-attendees']")
    assert attendees.locator("[data-field-error]").inner_text() == "Enter a whole number"
    expect(page.locator(".error-summary")).to_be_focused()
    assert "/requests/" in page.url  # nothing was sent

    # The server checks again with the same rules (client checks off): errors beside the fields, values kept.
    form.evaluate("f => { f.dataset.clientChecks = 'off' }")
    page.get_by_label("Title").fill("ab")
    page.get_by_role("button", name=re.compile("Approve and send")).click()
    page.wait_for_selector(".error-summary h2:text('There is a problem')")
    assert (
        page.locator("[data-field][data-name='f-attendees'] .field-error").inner_text()
        == "Enter a whole number"
    )
    assert page.locator("[data-field][data-name='f-title'] .field-error").inner_text() == (
        "Enter at least 3 characters"
    )
    assert page.get_by_label("Expected attendees").input_value() == "2o"
    assert page.get_by_label("Title").input_value() == "ab"
    assert page.get_by_label("Agenda").input_value() == "https://example.com/agenda"
    assert page.get_by_label("Projector").is_checked() and page.get_by_label("High").is_checked()
    # The page's script focuses the summary once it runs, which may be after the summary is drawn.
    expect(page.locator(".error-summary[data-autofocus]")).to_be_focused()
    assert retries(demo_server.url) == []

    page.get_by_label("Title").fill("Release review 2.3")
    page.get_by_label("Expected attendees").fill("6")
    expect(page.get_by_role("button", name=re.compile("Approve and send"))).to_be_enabled()
    page.keyboard.press("Control+Enter")  # approving needs the modifier: Enter alone never sends
    page.wait_for_url(QUEUE_URL)
    assert "Approved “meeting”" in page.locator(".messages").inner_text()

    finished(call_id)
    sent = retries(demo_server.url)
    assert len(sent) == 1
    content = sent[0]["meeting"]["content"]
    assert sent[0]["meeting"]["action"] == "accept"
    assert content == {
        "title": "Release review 2.3",
        "organizer_email": "ana@example.com",
        "agenda_url": "https://example.com/agenda",
        "date": "2026-12-03",
        "starts_at": "2026-12-03T10:30:00+01:00",
        "duration_hours": 1.5,
        "attendees": 6,
        "recorded": True,
        "room": "borealis",
        "priority": "high",
        "timezone": "Europe/Paris",
        "topics": ["roadmap", "budget"],
        "equipment": ["projector", "video"],
    }
    assert type(content["attendees"]) is int and type(content["duration_hours"]) is float

    page.goto(f"/calls/{call_id}/")
    page.wait_for_selector("[data-call-status='completed']")
    assert page.get_by_role("heading", name="Audit trail").is_visible()
    assert page.locator(".audit-trail li code", has_text="input.answered").count() == 1
    assert "Release review 2.3" in page.locator(".result").inner_text()
    screenshot(page, "call")


def test_url_mode_shows_the_domain_and_opens_only_after_a_click(hub: Hub, new_page) -> None:
    page = new_page("alice")
    external: list[Any] = []
    page.context.on(
        "request", lambda request: external.append(request) if "example.com" in request.url else None
    )
    call_id = hub.agent.call("connect_account", {"service": "github"})
    ir = pending_request(call_id, "sign_in")
    page.goto(f"/requests/{ir.pk}/")

    assert page.locator("h1").inner_text() == "Deploy bot wants you to open an external page"
    assert page.locator("[data-domain] .domain-name").inner_text() == "example.com"
    assert page.locator("[data-full-url]").inner_text() == ir.url
    assert page.locator("[data-warning='other_domain']").is_visible()  # not the server's own host
    assert page.locator(f"a[href='{ir.url}']").count() == 0  # never a plain link, so never prefetched
    page.wait_for_timeout(300)  # give a prefetch the chance to happen, if anything were to do one
    assert external == []
    screenshot(page, "url")

    with page.context.expect_page() as popup_info:
        page.get_by_role("button", name="Open example.com").click()
    popup = popup_info.value
    wait_until(lambda: any(request.url == ir.url for request in external), 10, what="the external page")
    opened = next(request for request in external if request.url == ir.url)
    assert opened.is_navigation_request() and opened.frame.page is popup
    assert "referer" not in opened.all_headers()
    assert popup.evaluate("window.opener") is None
    ir.refresh_from_db()
    assert (ir.status, ir.action, ir.content) == ("answered", "accept", None)
    assert page.locator("[data-url-after]").is_visible()
    finished(call_id)


def test_two_reviewers_answer_the_same_request_and_the_loser_sees_who_won(hub: Hub, new_page) -> None:
    bob = factories.user("bob")
    Membership.objects.create(team=Team.objects.get(slug="release"), user=bob, role="reviewer")
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    ir = pending_request(call_id, "environment")
    alice_page, bob_page = new_page("alice"), new_page("bob")
    alice_page.goto(f"/requests/{ir.pk}/")
    wait_live(alice_page)
    wait_until(lambda: presence.viewers([ir.pk]), 10, what="alice's presence")
    bob_page.goto(f"/requests/{ir.pk}/")
    wait_live(bob_page)
    # Presence: each sees the other looking.
    bob_page.wait_for_selector(f"[data-presence-for='{ir.pk}'] .presence:has-text('alice')")
    bob_page.get_by_label("Production").check()

    alice_page.get_by_label("Staging").check()
    alice_page.get_by_role("button", name=re.compile("Approve and send")).click()
    assert confirm_second_look(alice_page)  # create_deployment is destructive, as the demo server says
    alice_page.wait_for_url(QUEUE_URL)

    # Bob's open form locks without a reload, keeping what he chose, and says who answered.
    bob_page.wait_for_selector("[data-decided-slot] .decided:has-text('Approved by alice')")
    assert bob_page.get_by_label("Production").is_checked()
    assert bob_page.get_by_role("button", name=re.compile("Approve and send")).is_disabled()
    screenshot(bob_page, "race")

    # Had his click gone out anyway, the server says the same, calmly.
    bob_page.evaluate(
        "() => { const f = document.querySelector('[data-answer-form]');"
        " f.querySelector('[data-form-body]').disabled = false; f.dataset.clientChecks = 'off'; f.submit(); }"
    )
    bob_page.wait_for_selector(".notice:has-text('already accepted by alice')")
    ir.refresh_from_db()
    assert (ir.answered_by.username, ir.content) == ("alice", {"environment": "staging"})


def test_persian_text_from_a_server_reads_right_to_left(hub: Hub, new_page) -> None:
    message = "لطفاً اتاق جلسه را برای بازبینی نسخه انتخاب کنید."
    schema = {
        "type": "object",
        "properties": {
            "room": {
                "type": "string",
                "title": "اتاق جلسه",
                "description": "جایی که جلسه برگزار می‌شود.",
                "oneOf": [{"const": "atlas", "title": "اطلس"}, {"const": "borealis", "title": "شفق قطبی"}],
            }
        },
        "required": ["room"],
    }
    response = hub.agent.post(
        "/relays",
        {
            "server": "demo",
            "tool": "book_room",
            "arguments": {"team": "release"},
            "input_requests": {
                "room": {
                    "method": "elicitation/create",
                    "params": {"message": message, "requestedSchema": schema},
                }
            },
        },
    )
    assert response.status_code == 201, response.content
    ir = pending_request(response.json()["id"], "room")
    page = new_page("alice")
    assert page.locator(f"[data-request='{ir.pk}'] .message-excerpt").inner_text() == message
    assert page.locator(f"[data-request='{ir.pk}'] .message-excerpt").evaluate("e => e.matches(':dir(rtl)')")
    page.goto(f"/requests/{ir.pk}/")
    quote = page.locator("[data-server-message]")
    assert quote.inner_text() == message
    assert quote.evaluate("e => e.matches(':dir(rtl)')")
    for text in ("اتاق جلسه", "اطلس", "شفق قطبی", "جایی که جلسه برگزار می‌شود."):
        element = page.get_by_text(text, exact=True)
        assert element.evaluate("e => e.matches(':dir(rtl)')"), text
    # The hub's own page stays left to right around them.
    assert page.evaluate("document.documentElement.dir") == "ltr"
    assert page.locator("h1").evaluate("e => e.matches(':dir(ltr)')")
    screenshot(page, "persian")

    page.get_by_label("شفق قطبی").check()
    page.get_by_role("button", name=re.compile("Approve and send")).click()
    page.wait_for_url(QUEUE_URL)
    ir.refresh_from_db()
    assert ir.content == {"room": "borealis"}


@pytest.fixture
def web_showing_three(web: Any) -> Iterator[Daphne]:
    """A web process of its own whose queue page shows at most 3 rounds (ELICIT_QUEUE_MAX)."""
    daphne = Daphne(child_env(ELICIT_QUEUE_MAX="3")).start()
    try:
        yield daphne
    finally:
        daphne.stop()


def test_a_backlog_past_the_page_counts_everything_and_the_next_rounds_come_in_as_these_are_answered(
    hub: Hub, new_page, web_showing_three: Daphne
) -> None:
    """The queue shows the ELICIT_QUEUE_MAX rounds that waited longest and counts all of them; a newer round
    arriving only changes the count (asked of the server, not the whole list); once half of the rounds shown
    are answered, the next oldest come in at the end."""
    agent = AgentClient.objects.get(name="ci-agent")
    calls = ToolCall.objects.bulk_create(
        ToolCall(agent=agent, server=hub.server, tool="rotate_keys", arguments={}, status="awaiting_input")
        for _ in range(4)
    )
    start, deadline = timezone.now() - timedelta(hours=1), timezone.now() + timedelta(hours=1)
    rounds = Round.objects.bulk_create(Round(call=call, number=1, deadline=deadline) for call in calls)
    backlog = InputRequest.objects.bulk_create(
        InputRequest(
            round=rnd,
            key="confirm",
            message="Rotate?",
            requested_schema=factories.ENVIRONMENT_SCHEMA,
            team=hub.server.default_team,
            created_at=start + timedelta(seconds=i),
        )
        for i, rnd in enumerate(rounds)
    )
    page = new_page("alice", base_url=web_showing_three.url)
    wait_live(page)
    cards, count, more = (
        page.locator("article.card"),
        page.locator("[data-pending-count]"),
        page.locator("[data-queue-more]"),
    )
    expect(cards).to_have_count(3)
    expect(count).to_have_text("4")
    expect(more).to_contain_text("Rounds with later deadlines wait behind the 3 shown here")
    assert page.locator(f"article.card[data-call='{calls[3].pk}']").count() == 0
    page.evaluate(COUNT_LIST_READS)

    # A newer round: counted, not shown, and the page fetched only the count.
    call_id = hub.agent.call("schedule_meeting")
    waiting = wait_until(
        lambda: InputRequest.objects.filter(round__call_id=call_id, status="pending").count(),
        30,
        what="the new round",
    )
    expect(count).to_have_text(str(4 + waiting))
    expect(cards).to_have_count(3)
    assert page.evaluate("window.__lists") == 0
    expect(page.locator("#announcer")).to_have_text(
        "New request from Deploy bot: schedule_meeting, waiting behind the ones due sooner"
    )

    # The oldest is answered elsewhere: it folds away, and the count follows.
    answers.input_respond(input_request_id=backlog[0].pk, user=hub.reviewer_user, action="cancel")
    expect(page.locator(f"article.card[data-call='{calls[0].pk}']")).to_have_count(0, timeout=20_000)
    expect(cards).to_have_count(2)
    expect(count).to_have_text(str(3 + waiting))
    # The second: one round of three is left, so the next that waited longest come in at the end.
    answers.input_respond(input_request_id=backlog[1].pk, user=hub.reviewer_user, action="cancel")
    expect(cards).to_have_count(3, timeout=20_000)
    expect(cards.nth(1)).to_have_attribute("data-call", str(calls[3].pk))
    expect(cards.last).to_have_attribute("data-call", str(call_id))
    expect(count).to_have_text(str(2 + waiting))
    expect(more).to_have_count(0)  # all that waits is shown


def test_a_lost_connection_is_announced_once_not_every_second(hub: Hub, new_page) -> None:
    """The live region says "Reconnecting…" once; the time since the last update ticks beside it, unread."""
    page = new_page("alice")
    sockets: dict[str, Any] = {"down": False, "open": []}

    def route(ws: Any) -> None:
        if sockets["down"]:
            ws.close()
            return
        ws.connect_to_server()
        sockets["open"].append(ws)

    page.route_web_socket(re.compile(r"/ws/"), route)
    page.reload()
    wait_live(page)
    region = page.locator("#live-status [role=status]")
    expect(region).to_have_text("Live")
    page.evaluate(
        """() => {
            window.announced = 0;
            new MutationObserver(() => { window.announced += 1; }).observe(
                document.querySelector("#live-status [role=status]"),
                { childList: true, characterData: true, subtree: true },
            );
        }"""
    )
    sockets["down"] = True
    for ws in sockets["open"]:
        ws.close()
    page.wait_for_selector("#live-status[data-state='down']")
    expect(page.locator("#live-status [data-live-ago]")).to_contain_text("Updated")
    page.wait_for_timeout(2500)  # a few ticks, and a few failed retries
    expect(region).to_have_text("Reconnecting…")
    assert page.evaluate("window.announced") == 1
