"""An approval covers the call as the rule that stopped it asked: when the call as it would be sent falls
under another gate rule first (a reviewer edited the arguments into a stricter rule's reach, or a rule was
added before it since), that rule's team decides it. Before, a reviewer of a lenient rule could edit the
arguments of a call into what a stricter rule (another team, two approvals) stops, and it was sent on their
approval alone. Driven step by step on the real database: submit, decide, then the send the worker runs."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    Gate,
    InputRequest,
    McpServer,
    Membership,
    Policy,
    Round,
    RoutingRule,
    ToolCall,
)
from approvals.services import calls, gate_decisions, sending, tokens
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_rules() -> dict[str, Any]:
    """`deploy` on production needs two approvals of team sre (position 1); any deploy needs one approval of
    team release (position 2)."""
    alice, carol, dave = (factories.user(name) for name in ("alice", "carol", "dave"))
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    sre = factories.team("sre", (carol, Membership.Role.REVIEWER), (dave, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[
            {
                "name": "deploy",
                "inputSchema": {"type": "object", "properties": {"environment": {"type": "string"}}},
                "annotations": {"destructiveHint": True},
            }
        ],
        tools_fetched_at=timezone.now(),
    )
    strict = RoutingRule.objects.create(
        position=1,
        name="production",
        server=server,
        tool_pattern="deploy",
        gate=True,
        team=sre,
        policy=Policy.objects.create(name="two", approvals_required=2),
        conditions=[{"argument": "environment", "op": "==", "value": "production"}],
    )
    lenient = RoutingRule.objects.create(
        position=2,
        name="any deploy",
        server=server,
        tool_pattern="deploy",
        gate=True,
        team=release,
        policy=Policy.objects.create(name="one"),
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    return {
        "agent": agent,
        "alice": alice,
        "carol": carol,
        "dave": dave,
        "strict": strict,
        "lenient": lenient,
    }


def _submit(world: dict[str, Any], environment: str) -> ToolCall:
    call, _ = calls.call_submit(
        agent=world["agent"], server_slug="deploy", tool="deploy", arguments={"environment": environment}
    )
    return call


def _gate_request(call: ToolCall) -> InputRequest:
    return InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE, status="pending")


def test_an_edit_into_a_stricter_rule_is_decided_by_that_rules_team(two_rules: dict[str, Any]) -> None:
    call = _submit(two_rules, "staging")
    asked = _gate_request(call)
    assert asked.rule_id == two_rules["lenient"].pk and asked.team.slug == "release"
    gate_decisions.gate_decide(
        input_request_id=asked.pk,
        user=two_rules["alice"],
        decision="edit",
        arguments={"environment": "production"},
    )
    assert sending._claim(call.pk) is None  # the worker's send: nothing leaves
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    first, second = Gate.objects.filter(call=call).order_by("created_at")
    assert first.status == Gate.Status.VOIDED and "'production'" in first.reason
    assert second.status == Gate.Status.OPEN and second.rule_id == two_rules["strict"].pk
    now = _gate_request(call)
    assert now.team.slug == "sre" and now.approvals_required == 2
    assert now.params["arguments"] == {"environment": "production"}
    voided = AuditEvent.objects.get(call_id=call.pk, verb="gate.voided")
    assert "falls under the rule 'production'" in voided.data["reason"]

    # The strict rule's two approvals send it, once.
    for who in ("carol", "dave"):
        gate_decisions.gate_decide(input_request_id=now.pk, user=two_rules[who], decision="approve")
    send = sending._claim(call.pk)
    assert send is not None
    assert Gate.objects.get(pk=second.pk).status == Gate.Status.USED


def test_an_approval_under_the_same_rule_or_an_edit_out_of_every_rule_is_sent(
    two_rules: dict[str, Any],
) -> None:
    call = _submit(two_rules, "staging")
    gate_decisions.gate_decide(
        input_request_id=_gate_request(call).pk,
        user=two_rules["alice"],
        decision="edit",
        arguments={"environment": "qa"},
    )
    assert sending._claim(call.pk) is not None
    assert Gate.objects.get(call=call).status == Gate.Status.USED

    # The lenient rule disabled after the approval: no rule asks for an approval now, the call goes.
    other = _submit(two_rules, "staging")
    gate_decisions.gate_decide(
        input_request_id=_gate_request(other).pk, user=two_rules["alice"], decision="approve"
    )
    RoutingRule.objects.filter(pk=two_rules["lenient"].pk).update(enabled=False)
    assert sending._claim(other.pk) is not None
