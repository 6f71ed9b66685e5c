"""The live queue keeps the server's order, soonest deadline first: a round that opens while the page is
shown comes in at its place, not at the end, and the keyboard focus stays where it was; a round whose
deadline is extended moves to its new place."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.models import AgentClient, InputRequest, Policy, Round, ToolCall
from approvals.services import extensions
from tests import factories
from tests.browser.conftest import reload_live, wait_live
from tests.hub import Hub
from tests.live import Daphne, child_env, wait_until


def test_a_round_opening_live_comes_in_at_its_deadline_s_place(hub: Hub, new_page) -> None:
    agent = AgentClient.objects.get(name="ci-agent")
    soon, late = ToolCall.objects.bulk_create(
        ToolCall(agent=agent, server=hub.server, tool="rotate_keys", arguments={}, status="awaiting_input")
        for _ in range(2)
    )
    now = timezone.now()
    # The hub gives a new round an hour (ELICIT_ROUND_TTL): one of these is due before it, one after.
    rounds = Round.objects.bulk_create(
        [
            Round(call=soon, number=1, deadline=now + timedelta(minutes=20)),
            Round(call=late, number=1, deadline=now + timedelta(hours=3)),
        ]
    )
    InputRequest.objects.bulk_create(
        InputRequest(
            round=rnd,
            key="confirm",
            message="Rotate?",
            requested_schema=factories.ENVIRONMENT_SCHEMA,
            team=hub.server.default_team,
        )
        for rnd in rounds
    )
    page = new_page("alice")
    wait_live(page)
    cards = page.locator("article.card")
    expect(cards).to_have_count(2)
    expect(cards.first).to_have_attribute("data-call", str(soon.pk))
    # The reviewer is on the later round's row, by keyboard.
    page.locator(f"article.card[data-call='{late.pk}'] [data-open]").first.focus()

    call_id = hub.agent.call("schedule_meeting")
    wait_until(
        lambda: InputRequest.objects.filter(round__call_id=call_id, status="pending").exists(),
        30,
        what="the new round",
    )
    expect(cards).to_have_count(3)
    expect(cards.nth(1)).to_have_attribute("data-call", call_id)
    assert [cards.nth(i).get_attribute("data-call") for i in range(3)] == [
        str(soon.pk),
        call_id,
        str(late.pk),
    ]
    expect(page.locator("#announcer")).to_contain_text("schedule_meeting")
    focused = page.evaluate("() => document.activeElement.closest('article.card')?.dataset.call")
    assert focused == str(late.pk)


def test_a_round_whose_deadline_is_extended_moves_to_its_new_place(hub: Hub, new_page) -> None:
    agent = AgentClient.objects.get(name="ci-agent")
    calls = ToolCall.objects.bulk_create(
        ToolCall(agent=agent, server=hub.server, tool="rotate_keys", arguments={}, status="awaiting_input")
        for _ in range(3)
    )
    now = timezone.now()
    rounds = Round.objects.bulk_create(
        Round(call=call, number=1, deadline=now + timedelta(minutes=minutes))
        for call, minutes in zip(calls, (10, 20, 60), strict=True)
    )
    policy = Policy.objects.create(name="extendable", ttl=3600, extend_by=1800, max_extensions=1)
    first, *_ = InputRequest.objects.bulk_create(
        InputRequest(
            round=rnd,
            key="confirm",
            message="Rotate?",
            requested_schema=factories.ENVIRONMENT_SCHEMA,
            team=hub.server.default_team,
            policy=policy,
        )
        for rnd in rounds
    )
    page = new_page("alice")
    # The list the page reads on hello drawn before the extension: else it may bring the new order itself.
    reload_live(page)
    page.mouse.move(5, 5)
    cards = page.locator("article.card")
    expect(cards).to_have_count(3)
    expect(cards.first).to_have_attribute("data-call", str(calls[0].pk))

    # Due in 10 minutes, now in 40: after the one due in 20, before the one due in an hour.
    extensions.round_extend(input_request_id=first.pk, user=hub.reviewer_user)
    expect(cards.nth(1)).to_have_attribute("data-call", str(calls[0].pk))
    assert [cards.nth(i).get_attribute("data-call") for i in range(3)] == [
        str(c.pk) for c in calls[1::-1] + calls[2:]
    ]


@pytest.fixture
def web_showing_three(web: Any) -> Iterator[Daphne]:
    """A web process of its own whose queue page shows at most 3 rounds (ELICIT_QUEUE_MAX)."""
    daphne = Daphne(child_env(ELICIT_QUEUE_MAX="3")).start()
    try:
        yield daphne
    finally:
        daphne.stop()


def test_a_page_showing_only_the_rounds_due_soonest_takes_in_one_due_sooner_still(
    hub: Hub, new_page, web_showing_three: Daphne
) -> None:
    """Past ELICIT_QUEUE_MAX the page shows the rounds due soonest: a round opening that is due before the
    last of them is shown at its place, not counted as waiting behind them."""
    agent = AgentClient.objects.get(name="ci-agent")
    calls = ToolCall.objects.bulk_create(
        ToolCall(agent=agent, server=hub.server, tool="rotate_keys", arguments={}, status="awaiting_input")
        for _ in range(4)
    )
    now = timezone.now()
    rounds = Round.objects.bulk_create(
        Round(call=call, number=1, deadline=now + timedelta(minutes=minutes))
        for call, minutes in zip(calls, (20, 90, 120, 150), strict=True)
    )
    InputRequest.objects.bulk_create(
        InputRequest(
            round=rnd,
            key="confirm",
            message="Rotate?",
            requested_schema=factories.ENVIRONMENT_SCHEMA,
            team=hub.server.default_team,
        )
        for rnd in rounds
    )
    page = new_page("alice", base_url=web_showing_three.url)
    wait_live(page)
    page.mouse.move(5, 5)
    cards = page.locator("article.card")
    expect(cards).to_have_count(3)
    expect(page.locator("[data-pending-count]")).to_have_text("4")

    call_id = hub.agent.call("schedule_meeting")  # due in an hour (ELICIT_ROUND_TTL)
    waiting = wait_until(
        lambda: InputRequest.objects.filter(round__call_id=call_id, status="pending").count(),
        30,
        what="the new round",
    )
    expect(cards).to_have_count(4)
    shown = [cards.nth(i).get_attribute("data-call") for i in range(4)]
    assert shown == [str(calls[0].pk), call_id, str(calls[1].pk), str(calls[2].pk)]
    expect(page.locator("[data-pending-count]")).to_have_text(str(4 + waiting))
    expect(page.locator("#announcer")).to_have_text("New request from Deploy bot: schedule_meeting")
