"""A decision on a gate is refused (and recorded) or told what became of the gate before its body is read:
someone outside the gate's team learns nothing of the call from a grant's conditions, and a decision that
comes too late is a 409 whatever is wrong with it."""

from __future__ import annotations

import pytest

from approvals.models import AuditEvent, Grant, InputRequest
from tests import factories
from tests.test_lox3_decisions import error_of, gated, personal

__all__ = ["gated"]  # the fixture, shared

pytestmark = pytest.mark.django_db


def _on(value: str) -> dict:
    condition = {"argument": "environment", "op": "==", "value": value}
    return {"for": "1h", "arguments": "conditions", "conditions": [condition]}


def test_an_outsider_cannot_probe_a_gates_arguments_through_a_grants_conditions(gated) -> None:
    _, _, ir = gated
    mallory = personal(factories.user("mallory"))
    answers = [
        mallory.post(f"/input-requests/{ir.pk}/decide", {"decision": "approve", "grant": _on(guess)})
        for guess in ("production", "staging")  # the call asked for staging
    ]
    assert [error_of(answer, 403)["code"] for answer in answers] == ["not_a_reviewer", "not_a_reviewer"]
    refused = AuditEvent.objects.filter(verb="input.refused", input_request_id=ir.pk, actor_label="mallory")
    assert refused.count() == 2
    assert InputRequest.objects.get(pk=ir.pk).status == InputRequest.Status.PENDING
    assert not Grant.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"decision": "decline", "arguments": {}},
        {"decision": "edit"},
        {"decision": "approve", "grant": {"for": "forever"}},
    ],
)
def test_a_decision_on_a_decided_gate_is_told_so_first(gated, body: dict) -> None:
    alice, bob, ir = gated
    assert personal(bob).post(f"/input-requests/{ir.pk}/decide", {"decision": "approve"}).status_code == 200
    late = error_of(personal(alice).post(f"/input-requests/{ir.pk}/decide", body), 409)
    assert late["code"] == "already_answered" and "bob" in late["message"]
