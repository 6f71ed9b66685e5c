"""Request pages in the browser once the request is not (or not for this person) open: a team viewer's page
does not say "Pending" for good once a reviewer answered, and an answered request's decline stays shut."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.models import InputRequest, McpServer, Membership, Round, RoutingRule, ToolCall
from approvals.services import calls, gate_decisions
from approvals.services.answers import input_respond
from tests import factories
from tests.browser.conftest import wait_live

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def team(live_db: None) -> Any:
    alice, vera = factories.user("alice"), factories.user("vera")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (vera, Membership.Role.VIEWER))
    server = factories.server("deploy", name="Deploy bot", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[server])
    return SimpleNamespace(alice=alice, vera=vera, release=release, server=server, agent=agent)


def test_a_viewers_open_request_page_shows_the_answer_given_meanwhile(
    web: Any, new_page: Any, team: Any
) -> None:
    # A relay: its round hands the answers to the agent as soon as they are all in (no worker needed).
    call = factories.call(team.server, team.agent, kind=ToolCall.Kind.RELAY)
    rnd = factories.open_round(call, team_=team.release)
    ir = rnd.input_requests.get()
    page = new_page("vera")
    page.goto(f"/requests/{ir.pk}/")
    review = page.locator("[data-review]")
    expect(review).to_have_attribute("data-watch-request", "")
    expect(page.locator(".status-line .badge")).to_have_text("Pending")
    wait_live(page)
    expect(review).to_have_attribute("data-watching", "")  # the hub tells the page of the call's changes
    input_respond(input_request_id=ir.pk, user=team.alice, action="decline", reason="wrong day")
    decided = page.locator("[data-decided]")
    expect(decided).to_contain_text("Declined by alice")
    expect(decided).to_contain_text("wrong day")
    expect(page.locator(".status-line")).to_be_hidden()
    expect(page.locator("#announcer")).to_contain_text("Declined by alice")


def test_d_on_an_answered_request_leaves_its_decline_shut(web: Any, new_page: Any, team: Any) -> None:
    rnd = factories.open_round(factories.call(team.server, team.agent), team_=team.release)
    ir = rnd.input_requests.get()
    input_respond(input_request_id=ir.pk, user=team.alice, action="cancel")
    page = new_page("alice")
    page.goto(f"/requests/{ir.pk}/#decline")
    expect(page.locator("[data-decided]")).to_contain_text("Dismissed by alice")
    decline = page.locator("[data-decline]")
    assert decline.get_attribute("open") is None  # the address's #decline opened nothing
    page.locator("body").press("d")
    page.locator("body").press("?")  # a key handled after "d": by then "d" has done whatever it does
    expect(page.locator("#shortcuts-help")).to_be_visible()
    assert decline.get_attribute("open") is None


def test_a_viewers_open_gate_page_shows_the_decision_given_meanwhile(
    web: Any, new_page: Any, team: Any
) -> None:
    McpServer.objects.filter(pk=team.server.pk).update(
        tools=[
            {"name": "wipe", "inputSchema": {"type": "object", "properties": {"bucket": {"type": "string"}}}}
        ],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(
        position=1, name="wipes", server=team.server, tool_pattern="wipe", gate=True, team=team.release
    )
    call, _ = calls.call_submit(
        agent=team.agent, server_slug="deploy", tool="wipe", arguments={"bucket": "logs"}
    )
    ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
    page = new_page("vera")
    page.goto(f"/requests/{ir.pk}/")
    review = page.locator("[data-review][data-gate]")
    expect(review).to_have_attribute("data-watch-request", "")
    wait_live(page)
    expect(review).to_have_attribute("data-watching", "")

    gate_decisions.gate_decide(
        input_request_id=ir.pk, user=team.alice, decision="decline", reason="not today"
    )

    expect(page.locator("[data-decided]")).to_contain_text("not today")
    expect(page.locator(".status-line")).to_be_hidden()
