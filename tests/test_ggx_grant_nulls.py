"""A grant's ``!=`` and ``not in`` read an argument given as null as they read one not given: they cover
nothing, since the server reads null as its own default, which the hub cannot see and which may be the very
value the condition excludes. On the real database, through the gate a call meets."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import AuditEvent, Grant, ToolCall
from approvals.services import calls, gate_decisions
from approvals.services.errors import Invalid
from tests.test_ggx_grantor import gate_request, world  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db


def submit(world: dict[str, Any], **arguments: Any) -> ToolCall:  # noqa: F811
    call, created = calls.call_submit(
        agent=world["agent"], server_slug="deploy", tool="wipe", arguments=arguments
    )
    assert created
    return call


def grant(world: dict[str, Any], condition: dict[str, Any], **asked: Any) -> Grant:  # noqa: F811
    ir = gate_request(submit(world, **asked))
    assert ir is not None
    choice = {"for": "1h", "arguments": "conditions", "conditions": [condition]}
    gate_decisions.gate_decide(input_request_id=ir.pk, user=world["alice"], decision="approve", grant=choice)
    return Grant.objects.get()


@pytest.mark.parametrize(
    "condition",
    [
        {"argument": "bucket", "op": "!=", "value": "production"},
        {"argument": "bucket", "op": "not in", "value": ["production", "billing"]},
    ],
)
def test_a_null_argument_is_not_covered_by_a_grant_excluding_values(world, condition) -> None:  # noqa: F811
    made = grant(world, condition, bucket="logs")
    assert submit(world, bucket="scratch").grant_id == made.pk
    nulled = submit(world, bucket=None)
    assert nulled.status == ToolCall.Status.AWAITING_INPUT and nulled.grant_id is None
    assert gate_request(nulled) is not None
    assert not AuditEvent.objects.filter(call_id=nulled.pk, verb="gate.granted").exists()


def test_a_null_inside_a_nested_argument_is_not_covered_either(world) -> None:  # noqa: F811
    made = grant(
        world, {"argument": "target.bucket", "op": "!=", "value": "production"}, target={"bucket": "a"}
    )
    assert submit(world, target={"bucket": "b"}).grant_id == made.pk
    assert submit(world, target={"bucket": None}).grant_id is None


def test_no_such_grant_is_made_for_an_approved_null(world) -> None:  # noqa: F811
    ir = gate_request(submit(world, bucket=None))
    assert ir is not None
    choice = {
        "for": "1h",
        "arguments": "conditions",
        "conditions": [{"argument": "bucket", "op": "!=", "value": "production"}],
    }
    with pytest.raises(Invalid):
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["alice"], decision="approve", grant=choice
        )
    assert not Grant.objects.exists()
    ir.refresh_from_db()
    assert ir.status == "pending"


def test_an_equality_on_null_still_covers_null(world) -> None:  # noqa: F811
    made = grant(world, {"argument": "bucket", "op": "==", "value": None}, bucket=None)
    assert submit(world, bucket=None).grant_id == made.pk
    assert submit(world, bucket="logs").grant_id is None
