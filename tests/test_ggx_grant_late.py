"""An approval carrying a grant, of a gate already decided or past its deadline, is told what became of the
gate (409), as any late answer is, not what the grant would have been refused for: "Only a reviewer of ..."
or "its conditions do not hold" sent a reviewer to fix a grant for a gate nobody can decide any more."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Grant, InputRequest, Round
from approvals.services import gate_decisions
from approvals.services.errors import Conflict, Invalid
from tests.test_ggx_grantor import gate_request, submit, world  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db

MISSES = {
    "for": "1h",
    "arguments": "conditions",
    "conditions": [{"argument": "bucket", "op": "==", "value": "other"}],
}


def test_a_grant_on_a_gate_another_reviewer_decided_is_told_it_was_decided(world) -> None:  # noqa: F811
    ir = gate_request(submit(world))
    assert ir is not None
    gate_decisions.gate_decide(input_request_id=ir.pk, user=world["bob"], decision="approve")
    with pytest.raises(Conflict) as late:
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["alice"], decision="approve", grant=MISSES
        )
    assert "bob" in late.value.message
    assert not Grant.objects.exists()


def test_a_grant_on_a_gate_past_its_deadline_is_told_it_expired(world) -> None:  # noqa: F811
    ir = gate_request(submit(world))
    assert ir is not None
    Round.objects.filter(pk=ir.round_id).update(deadline=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Conflict) as late:
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["alice"], decision="approve", grant=MISSES
        )
    assert "expired" in late.value.message
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not Grant.objects.exists()


def test_a_grant_that_cannot_be_made_on_an_open_gate_is_still_refused_and_decides_nothing(world) -> None:  # noqa: F811
    ir = gate_request(submit(world))
    assert ir is not None
    with pytest.raises(Invalid):
        gate_decisions.gate_decide(
            input_request_id=ir.pk, user=world["alice"], decision="approve", grant=MISSES
        )
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING
