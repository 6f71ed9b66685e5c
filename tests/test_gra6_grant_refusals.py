"""A grant asked for with an approval and refused is recorded (``grant.refused``, as a refused revoke is),
never with the arguments or the grant's conditions; and a grant that can no longer be used when a call is
submitted never fails the agent's submit: the call stops at its gate for a person. On the real database,
through the services the API and the dashboard call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from approvals.models import AuditEvent, Gate, Grant, InputRequest, Policy, ToolCall
from approvals.services import gate_decisions, grants
from approvals.services.errors import Conflict, Forbidden, Invalid
from tests.test_grants_scope import ON_LOGS, gate_request, grant_on_logs, submit
from tests.test_grants_scope import world as scope_world  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Wipes gated by team release (alice, bob) or, in production, security (sam): ``test_grants_scope``'s."""
    return request.getfixturevalue("scope_world")


def refused() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(verb="grant.refused").order_by("id"))


def assert_refused(event: AuditEvent, who: str, code: str, ir: InputRequest) -> None:
    assert (event.actor_type, event.actor_label) == (AuditEvent.ActorType.USER, who)
    assert (event.data["code"], event.team_slug, event.data["team"]) == (code, "release", "release")
    assert (event.data["server"], event.data["tool"]) == ("deploy", "wipe")
    assert event.input_request_id == ir.pk and event.call_id == ir.round.call_id
    assert "logs" not in json.dumps(event.data)  # neither the arguments nor the condition's value


def test_a_grant_asked_by_a_reviewer_the_gate_was_escalated_to_is_refused_and_recorded(world) -> None:
    ir = gate_request(submit(world, bucket="logs", env="staging"))
    assert ir is not None
    InputRequest.objects.filter(pk=ir.pk).update(escalation_team=world["security"])  # as escalation does
    with pytest.raises(Forbidden):
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["sam"], decision="approve", grant=ON_LOGS
        )
    (event,) = refused()
    assert_refused(event, "sam", "forbidden", ir)
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not Grant.objects.exists()  # nothing was decided


def test_a_grant_asked_on_a_gate_needing_two_approvals_is_refused_and_recorded(world) -> None:
    wipes = world["wipes"]
    wipes.policy = Policy.objects.create(name="two approvals", approvals_required=2)
    wipes.save()
    ir = gate_request(submit(world, bucket="logs", env="staging"))
    assert ir is not None and ir.approvals_required == 2
    for who in ("alice", "bob"):
        with pytest.raises(Invalid):
            gate_decisions.gate_decide(
                input_request_id=ir.pk, user=world[who], decision="approve", grant=ON_LOGS
            )
    alice, bob = refused()
    assert_refused(alice, "alice", "invalid_grant", ir)
    assert_refused(bob, "bob", "invalid_grant", ir)
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not ir.decisions.exists()


def test_a_grant_refused_after_the_approval_is_recorded_past_its_rolled_back_transaction(
    world, monkeypatch
) -> None:
    call = submit(world, bucket="logs", env="staging")
    ir = gate_request(call)
    assert ir is not None

    create = grants.create_from_approval

    def refuse(**kwargs: Any) -> Grant:
        create(**kwargs)  # made and audited, then rolled back with the refusal
        raise Invalid("This call is routed to no team, so no team could own a grant.", code="invalid_grant")

    monkeypatch.setattr(grants, "create_from_approval", refuse)
    with pytest.raises(Invalid):
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["alice"], decision="approve", grant=ON_LOGS
        )
    (event,) = refused()
    assert_refused(event, "alice", "invalid_grant", ir)
    assert not Grant.objects.exists() and not AuditEvent.objects.filter(verb="grant.created").exists()
    # The decision taken before it stands, as it did.
    assert Gate.objects.get(call=call).status == Gate.Status.APPROVED


def test_a_malformed_grant_and_an_allowed_one_record_no_refusal(world) -> None:
    ir = gate_request(submit(world, bucket="tmp", env="staging"))
    assert ir is not None
    with pytest.raises(Invalid):  # its conditions do not hold for the arguments: a 400, nothing recorded
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["alice"], decision="approve", grant=ON_LOGS
        )
    grant_on_logs(world)
    assert refused() == []


def test_a_grant_that_cannot_be_used_at_submit_stops_the_call_at_its_gate(world, monkeypatch) -> None:
    made = grant_on_logs(world)

    def inactive(grant: Grant, call: ToolCall) -> None:
        raise Conflict("This grant was revoked.", code="grant_inactive")

    monkeypatch.setattr(grants, "use", inactive)
    call = submit(world, bucket="logs", env="dev")  # covered by the grant, which cannot be used
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT and call.grant_id is None
    ir = gate_request(call)
    assert ir is not None and ir.team == world["release"]
    assert Gate.objects.get(call=call).status == Gate.Status.OPEN
    assert AuditEvent.objects.filter(call_id=call.pk, verb="gate.opened").count() == 1
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="gate.granted").exists()
    made.refresh_from_db()
    assert made.uses == 0
