"""Before the first send of a call a remembered grant let through, the server's tool list is listed again
when it is over `gates.SEND_FRESHNESS` seconds old, as before an approved gate's send: a tool the server
changed since the grant (its description, its schema) stops the call at a gate instead of going on the
grant of the old definition. The real demo MCP server over HTTP, on the real database."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from approvals.models import AuditEvent, Grant, InputRequest, McpServer, Round, RoutingRule, Team, ToolCall
from approvals.services import calls, gate_decisions, gates, servers
from tests import demo_support
from tests.hub import Hub, set_up_hub

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

TOOL = "create_deployment"
ARGS = {"branch": "main", "environment": "staging"}


@pytest.fixture
def hub(demo_server) -> Hub:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)
    RoutingRule.objects.create(
        position=1,
        name="destructive needs approval",
        server=hub.server,
        tool_pattern="*",
        destructive=True,
        gate=True,
        team=Team.objects.get(slug="release"),
    )
    return hub


def submit(hub: Hub) -> ToolCall:
    agent = hub.server.agents.get()
    call, created = calls.call_submit(agent=agent, server_slug=hub.server.slug, tool=TOOL, arguments=ARGS)
    assert created
    return call


def granted(hub: Hub) -> Grant:
    ir = InputRequest.objects.get(round__call=submit(hub), round__kind=Round.Kind.GATE)
    choice = {"for": "8h", "arguments": "exact"}
    gate_decisions.gate_decide(
        input_request_id=ir.pk, user=hub.reviewer_user, decision="approve", grant=choice
    )
    return Grant.objects.get()


def make_stale(hub: Hub) -> datetime:
    ago = timezone.now() - timedelta(seconds=gates.SEND_FRESHNESS + 30)
    McpServer.objects.filter(pk=hub.server.pk).update(tools_fetched_at=ago)
    return ago


def first_send(call: ToolCall) -> bool:
    gates.gate_refresh_tools(call.pk)
    with transaction.atomic():
        return gates.gate_at_send(ToolCall.objects.select_for_update().get(pk=call.pk))


def test_a_tool_changed_on_the_server_since_the_grant_stops_the_granted_call(hub: Hub, demo_server) -> None:
    made = granted(hub)
    call = submit(hub)
    assert call.status == ToolCall.Status.QUEUED and call.grant_id == made.pk
    demo_support.describe(demo_server.url, TOOL, "Deploy a branch, and delete the previous release.")
    make_stale(hub)
    assert first_send(call) is False
    lapsed = AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed")
    assert "the tool's definition changed" in lapsed.data["reason"]
    reopened = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE, status="pending")
    assert reopened.round.gate.tool["description"] == "Deploy a branch, and delete the previous release."


def test_an_unchanged_tool_lets_the_granted_call_go(hub: Hub, demo_server) -> None:
    made = granted(hub)
    call = submit(hub)
    stale = make_stale(hub)
    assert first_send(call) is True
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="gate.grant_lapsed").exists()
    hub.server.refresh_from_db()
    assert hub.server.tools_fetched_at is not None and hub.server.tools_fetched_at > stale  # listed again
    made.refresh_from_db()
    assert made.uses == 1
