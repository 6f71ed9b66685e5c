"""Two reviewers decide one gate at the same moment, one approving and one declining: exactly one decision
counts, and the gate, the call and the audit log agree on which (the other reviewer is told it was already
decided). On the real database, in threads of their own."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
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
from approvals.services import calls, gate_decisions, tokens
from approvals.services.errors import ServiceError
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def sends_stay_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """An approved call's send is not queued: a Celery worker another test left running would take it and
    move the call past the state these tests read."""
    monkeypatch.setattr(gate_decisions, "enqueue_on_commit", lambda *args, **kwargs: None)


def _race(ir: InputRequest, alice: Any, bob: Any) -> dict[str, Any]:
    """Alice approves and Bob declines the gate at the same moment; what each was told."""
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def decide(who: Any, decision: str, reason: str = "") -> None:
        try:
            barrier.wait(10)
            gate_decisions.gate_decide(input_request_id=ir.pk, user=who, decision=decision, reason=reason)
            outcomes[decision] = "ok"
        except ServiceError as exc:
            outcomes[decision] = exc.code
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=(alice, "approve")),
        threading.Thread(target=decide, args=(bob, "decline", "no")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def test_approve_and_decline_at_once_one_decision_counts() -> None:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[{"name": "wipe", "inputSchema": {"type": "object"}}],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(name="wipes", server=server, tool_pattern="wipe", gate=True, team=release)
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    for attempt in range(6):
        call, _ = calls.call_submit(agent=agent, server_slug="deploy", tool="wipe", arguments={"n": attempt})
        ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
        outcomes = _race(ir, alice, bob)
        assert sorted(outcomes.values()) == ["already_answered", "ok"], outcomes
        gate = Gate.objects.get(call=call)
        call.refresh_from_db()
        verbs = list(
            AuditEvent.objects.filter(
                call_id=call.pk, verb__in=["gate.approved", "gate.declined"]
            ).values_list("verb", flat=True)
        )
        if outcomes["approve"] == "ok":
            assert gate.status == Gate.Status.APPROVED and call.status == ToolCall.Status.QUEUED
            assert verbs == ["gate.approved"]
        else:
            assert gate.status == Gate.Status.DECLINED and call.status == ToolCall.Status.FAILED
            assert verbs == ["gate.declined"]
