"""Four eyes hold for grants too: a grant made by a reviewer who has since become the owner of its agent lets
nothing through (they would be approving their own agent's calls, which the gate refuses them), and a call
it let through before stops at a gate before its first send, saying why."""

from __future__ import annotations

import pytest

from approvals.models import AgentClient, AuditEvent, ToolCall
from approvals.services import gates
from tests.test_ggx_grantor import gate_request, granted_by, submit, world  # noqa: F401

pytestmark = pytest.mark.django_db


def _alice_owns_the_agent(world) -> None:  # noqa: F811
    AgentClient.objects.filter(pk=world["agent"].pk).update(owner=world["alice"])


def test_a_grant_whose_grantor_now_owns_the_agent_lets_nothing_through(world) -> None:  # noqa: F811
    granted_by(world, "alice")
    _alice_owns_the_agent(world)
    call = submit(world)
    assert call.status == ToolCall.Status.AWAITING_INPUT and call.grant_id is None
    assert gate_request(call) is not None
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="gate.granted").exists()


def test_a_call_let_through_before_its_grantor_owned_the_agent_stops_at_its_send(world) -> None:  # noqa: F811
    made = granted_by(world, "alice")
    call = submit(world)
    assert call.grant_id == made.pk
    _alice_owns_the_agent(world)
    assert gates.gate_at_send(call) is False
    lapsed = AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed")
    assert "now owns the agent" in lapsed.data["reason"]


def test_another_reviewers_grant_still_holds_for_that_owners_agent(world) -> None:  # noqa: F811
    made = granted_by(world, "bob")
    _alice_owns_the_agent(world)
    assert submit(world).grant_id == made.pk
