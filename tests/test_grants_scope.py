"""What a remembered grant may stand in for: only the gate its team would have decided, under a policy one
reviewer may satisfy. A grant one team made never lets through a call another team's gate rule stops, nor a
call that a rule needing several approvals stops; and a gate needing several approvals makes no grant, so one
reviewer cannot turn the team's N-of-M into "anyone, once". On the real database, through the services the
API and the dashboard call."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    Gate,
    Grant,
    InputRequest,
    McpServer,
    Membership,
    Policy,
    Round,
    RoutingRule,
    ToolCall,
)
from approvals.services import calls, gate_decisions, sending, tokens
from approvals.services.errors import Forbidden, Invalid
from tests import factories

pytestmark = pytest.mark.django_db

ON_LOGS = {
    "for": "until_revoked",
    "arguments": "conditions",
    "conditions": [{"argument": "bucket", "op": "==", "value": "logs"}],
}


@pytest.fixture
def world() -> dict[str, Any]:
    """Wipes are gated: production ones by team security (rule 1), any other by team release (rule 2)."""
    alice, bob, sam = factories.user("alice"), factories.user("bob"), factories.user("sam")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    security = factories.team("security", (sam, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[
            {
                "name": "wipe",
                "description": "Delete a bucket.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"bucket": {"type": "string"}, "env": {"type": "string"}},
                    "required": ["bucket"],
                },
                "annotations": {"destructiveHint": True},
            }
        ],
        tools_fetched_at=timezone.now(),
        default_team=release,
    )
    production = RoutingRule.objects.create(
        position=1,
        name="production wipes",
        server=server,
        tool_pattern="wipe",
        conditions=[{"argument": "env", "op": "==", "value": "prod"}],
        gate=True,
        team=security,
    )
    wipes = RoutingRule.objects.create(
        position=2, name="wipes", server=server, tool_pattern="wipe", gate=True, team=release
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    return {
        "alice": alice,
        "bob": bob,
        "sam": sam,
        "release": release,
        "security": security,
        "server": server,
        "production": production,
        "wipes": wipes,
        "agent": agent,
    }


def submit(world: dict[str, Any], **arguments: Any) -> ToolCall:
    call, created = calls.call_submit(
        agent=world["agent"], server_slug="deploy", tool="wipe", arguments=arguments
    )
    assert created
    return call


def gate_request(call: ToolCall) -> InputRequest | None:
    return InputRequest.objects.filter(
        round__call=call, round__kind=Round.Kind.GATE, status="pending"
    ).first()


def grant_on_logs(world: dict[str, Any]) -> Grant:
    """alice (release) approves a staging wipe of "logs" and remembers it for any wipe of "logs"."""
    first = submit(world, bucket="logs", env="staging")
    ir = gate_request(first)
    assert ir is not None and ir.team == world["release"]
    gate_decisions.gate_decide(input_request_id=ir.pk, user=world["alice"], decision="approve", grant=ON_LOGS)
    made = Grant.objects.get()
    assert made.team == world["release"]
    return made


def test_a_grant_of_one_team_does_not_let_through_a_call_another_teams_gate_stops(world) -> None:
    made = grant_on_logs(world)
    # The same grant still stands in for its own team's gate.
    staging = submit(world, bucket="logs", env="dev")
    assert staging.status == ToolCall.Status.QUEUED and staging.grant_id == made.pk

    production = submit(world, bucket="logs", env="prod")
    ir = gate_request(production)
    assert ir is not None, "release's grant let through a wipe only security may approve"
    assert ir.team == world["security"]
    assert production.status == ToolCall.Status.AWAITING_INPUT and production.grant_id is None
    assert not AuditEvent.objects.filter(call_id=production.pk, verb="gate.granted").exists()
    made.refresh_from_db()
    assert made.uses == 1


def test_a_grant_does_not_let_through_a_call_its_team_must_approve_twice(world) -> None:
    made = grant_on_logs(world)
    # Production wipes move to release too, under a policy of two approvals.
    production = world["production"]
    production.team = world["release"]
    production.policy = Policy.objects.create(name="two approvals", approvals_required=2)
    production.save()

    call = submit(world, bucket="logs", env="prod")
    ir = gate_request(call)
    assert ir is not None, "one reviewer's grant stood in for two approvals"
    assert ir.approvals_required == 2 and call.grant_id is None
    made.refresh_from_db()
    assert made.uses == 0


def test_a_granted_call_that_another_teams_rule_gates_by_send_time_stops_at_that_gate(world) -> None:
    made = grant_on_logs(world)
    call = submit(world, bucket="logs", env="dev")
    assert call.grant_id == made.pk
    # Before it is sent, an admin hands dev wipes to security.
    production = world["production"]
    production.conditions = [{"argument": "env", "op": "in", "value": ["prod", "dev"]}]
    production.save()

    assert sending._claim(call.pk) is None  # nothing is sent
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    ir = gate_request(call)
    assert ir is not None and ir.team == world["security"]
    lapsed = AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed")
    assert "security" in lapsed.data["reason"]


def test_a_gate_that_needs_two_approvals_makes_no_grant_and_decides_nothing(world) -> None:
    wipes = world["wipes"]
    wipes.policy = Policy.objects.create(name="two approvals", approvals_required=2)
    wipes.save()
    call = submit(world, bucket="logs", env="staging")
    ir = gate_request(call)
    assert ir is not None and ir.approvals_required == 2
    for who in ("alice", "bob"):
        with pytest.raises(Invalid) as raised:
            gate_decisions.gate_decide(
                input_request_id=ir.pk, user=world[who], decision="approve", grant=ON_LOGS
            )
        assert raised.value.code == "invalid_grant" and "grant" in raised.value.fields
        assert "2 approvals" in raised.value.message
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not ir.decisions.exists()
    assert not Grant.objects.exists()
    # Without a grant the two approvals decide it as usual.
    gate_decisions.gate_decide(input_request_id=ir.pk, user=world["alice"], decision="approve")
    gate_decisions.gate_decide(input_request_id=ir.pk, user=world["bob"], decision="approve")
    assert Gate.objects.get(call=call).status == Gate.Status.APPROVED


def test_the_gate_page_offers_no_grant_where_two_approvals_are_needed(world) -> None:
    client = Client()
    client.force_login(world["alice"])
    one = gate_request(submit(world, bucket="logs", env="staging"))
    assert one is not None
    assert 'name="grant_for"' in client.get(f"/requests/{one.pk}/").content.decode()

    wipes = world["wipes"]
    wipes.policy = Policy.objects.create(name="two approvals", approvals_required=2)
    wipes.save()
    two = gate_request(submit(world, bucket="tmp", env="staging"))
    assert two is not None and two.approvals_required == 2
    page = client.get(f"/requests/{two.pk}/").content.decode()
    assert "Approve and send as asked" in page
    assert 'name="grant_for"' not in page


def test_a_reviewer_the_gate_was_escalated_to_approves_it_but_makes_no_grant_for_the_team(world) -> None:
    call = submit(world, bucket="logs", env="staging")
    ir = gate_request(call)
    assert ir is not None and ir.team == world["release"]
    InputRequest.objects.filter(pk=ir.pk).update(escalation_team=world["security"])  # as escalation does
    with pytest.raises(Forbidden) as raised:
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["sam"], decision="approve", grant=ON_LOGS
        )
    assert "release" in raised.value.message
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not Grant.objects.exists()
    # The gate itself is theirs to decide.
    gate_decisions.gate_decide(input_request_id=ir.pk, user=world["sam"], decision="approve")
    assert Gate.objects.get(call=call).status == Gate.Status.APPROVED
    assert not Grant.objects.exists()
