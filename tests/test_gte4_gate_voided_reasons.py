"""Why an approval was voided names what changed: the rule (or the policy) that asked for it deleted between
the approval and the send is said so, in the gate's reason and its ``gate.voided`` event, rather than "the
call is not the one approved"."""

from __future__ import annotations

from typing import Any

from approvals.models import AuditEvent, Gate, Policy, RoutingRule, ToolCall
from approvals.services import gate_decisions, sending
from tests.test_gates import gate_request, gated, submit

__all__ = ["gated"]


def _approved(gated: dict[str, Any]) -> ToolCall:
    call = submit(gated)
    gate_decisions.gate_decide(
        input_request_id=gate_request(call).pk, user=gated["alice"], decision="approve"
    )
    return call


def test_a_rule_deleted_between_approval_and_send_is_named_and_the_call_goes(gated: dict[str, Any]) -> None:
    call = _approved(gated)
    RoutingRule.objects.filter(pk=gated["rule"].pk).delete()
    send = sending._claim(call.pk)
    assert send is not None  # no gate rule asks for the call any more: it goes as it is
    gate = Gate.objects.get(call=call)
    assert gate.status == Gate.Status.VOIDED
    assert gate.reason == "the rule that required the approval was deleted"
    voided = AuditEvent.objects.get(call_id=call.pk, verb="gate.voided")
    assert voided.data["reason"] == gate.reason


def test_a_policy_deleted_between_approval_and_send_is_named(gated: dict[str, Any]) -> None:
    call = _approved(gated)
    rule = gated["rule"]
    rule.policy = None
    rule.save()
    Policy.objects.filter(pk=gated["policy"].pk).delete()
    assert sending._claim(call.pk) is None  # the rule still asks: a new gate under it
    first, second = Gate.objects.filter(call=call).order_by("created_at")
    assert "the policy that required the approval was deleted" in first.reason
    assert second.status == Gate.Status.OPEN
