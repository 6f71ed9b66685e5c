"""A gate's deadline is the last moment it may be decided: "if nobody decides by then, the call is not sent".
Beat expires overdue rounds only every few seconds (and a few hundred at a time), so a decision arriving
after the deadline but before that sweep is refused, over the decide service, the generic respond path and
the browser alike; nothing is approved or sent. On the real database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    Gate,
    InputRequest,
    McpServer,
    Membership,
    Round,
    RoutingRule,
    ToolCall,
)
from approvals.services import answers, calls, escalation, gate_decisions, tokens
from approvals.services.errors import Conflict
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def gated() -> dict[str, Any]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[{"name": "wipe", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": True}}],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(name="wipes", server=server, tool_pattern="wipe", gate=True, team=release)
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    return {"alice": alice, "agent": agent}


def overdue_gate(gated: dict[str, Any]) -> tuple[ToolCall, InputRequest]:
    """A gated call whose gate's deadline passed a second ago, before beat's sweep got to it."""
    call, _ = calls.call_submit(agent=gated["agent"], server_slug="deploy", tool="wipe", arguments={"b": 1})
    ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
    Round.objects.filter(pk=ir.round_id).update(deadline=timezone.now() - timedelta(seconds=1))
    return call, ir


def assert_nothing_decided(call: ToolCall, ir: InputRequest) -> None:
    ir.refresh_from_db()
    call.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not ir.decisions.exists()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    assert Gate.objects.get(call=call).status == Gate.Status.OPEN
    assert not AuditEvent.objects.filter(
        call_id=call.pk, verb__in=["gate.approved", "input.answered"]
    ).exists()


@pytest.mark.parametrize("decision", ["approve", "decline"])
def test_a_gate_decided_after_its_deadline_is_refused(gated, decision) -> None:
    call, ir = overdue_gate(gated)
    with pytest.raises(Conflict) as raised:
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=gated["alice"], decision=decision, reason="too late"
        )
    assert raised.value.code == "already_answered"
    assert "expired" in raised.value.message and "not sent" in raised.value.message
    assert_nothing_decided(call, ir)
    # The sweep then ends it as expired, as it would have without the late decision.
    assert escalation.round_expire(round_id=ir.round_id)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.EXPIRED


def test_the_generic_respond_path_refuses_a_late_approval_too(gated) -> None:
    call, ir = overdue_gate(gated)
    with pytest.raises(Conflict):
        answers.input_respond(input_request_id=ir.pk, user=gated["alice"], action="accept")
    assert_nothing_decided(call, ir)


def test_the_browser_gets_a_readable_page_for_a_late_approval(gated) -> None:
    call, ir = overdue_gate(gated)
    client = Client()
    client.force_login(gated["alice"])
    response = client.post(f"/requests/{ir.pk}/decide/", {"decision": "approve"})
    assert response.status_code == 409
    assert "expired" in response.content.decode()
    assert_nothing_decided(call, ir)


def test_a_gate_decided_before_its_deadline_is_approved(gated) -> None:
    call, _ = calls.call_submit(agent=gated["agent"], server_slug="deploy", tool="wipe", arguments={"b": 1})
    ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
    gate_decisions.gate_decide(input_request_id=ir.pk, user=gated["alice"], decision="approve")
    call.refresh_from_db()
    assert call.status == ToolCall.Status.QUEUED
