"""A grant found at submit is used in the same transaction: a grant that expires, or whose grantor is removed,
in the instant between ``grants.find`` and ``grants.use`` lets the call through (checked again before its
first send), and never fails the agent's submit with an error that leaves no call and no gate."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db.models import F

from approvals.models import AuditEvent, Grant, Membership, ToolCall
from approvals.services import gate_decisions, gates, grants
from approvals.services.errors import Conflict
from tests.test_ggx_grantor import gate_request, submit, world  # noqa: F401

pytestmark = pytest.mark.django_db

FOR_AN_HOUR = {"for": "1h", "arguments": "exact"}


def granted(world: dict[str, Any]) -> Grant:  # noqa: F811
    ir = gate_request(submit(world))
    assert ir is not None
    gate_decisions.gate_decide(
        input_request_id=ir.pk, user=world["alice"], decision="approve", grant=FOR_AN_HOUR
    )
    return Grant.objects.get()


def after_find(monkeypatch: pytest.MonkeyPatch, then: Callable[[Grant], None]) -> None:
    """Run ``then`` right after the gate's ``grants.find`` returns a grant, before ``grants.use``."""
    original = grants.find

    def find(**kwargs: Any) -> Grant | None:
        found = original(**kwargs)
        if found is not None:
            then(found)
        return found

    monkeypatch.setattr(grants, "find", find)


def test_a_grant_expiring_between_find_and_use_lets_the_call_through(world, monkeypatch) -> None:  # noqa: F811
    made = granted(world)
    later = made.expires_at + timedelta(seconds=1)
    # The clock passes the grant's expiry between the gate's look-up and the use it records.
    after_find(
        monkeypatch, lambda _: monkeypatch.setattr(grants, "timezone", SimpleNamespace(now=lambda: later))
    )
    call = submit(world)
    assert call.status == ToolCall.Status.QUEUED and call.grant_id == made.pk
    made.refresh_from_db()
    assert made.uses == 1
    assert AuditEvent.objects.filter(call_id=call.pk, verb="gate.granted").count() == 1
    monkeypatch.undo()
    # Expired by the time it is sent (as the clock now says): the first send stops it at a gate.
    Grant.objects.filter(pk=made.pk).update(
        created_at=F("created_at") - timedelta(hours=2), expires_at=F("expires_at") - timedelta(hours=2)
    )
    assert gates.gate_at_send(call) is False
    assert "expired" in AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed").data["reason"]


def test_a_grantor_removed_between_find_and_use_lets_the_call_through_to_its_send_check(
    world,  # noqa: F811
    monkeypatch,
) -> None:
    made = granted(world)

    def remove_alice(_: Grant) -> None:  # committed by someone else between the two statements
        Membership.objects.filter(user=world["alice"], team=world["release"]).delete()

    after_find(monkeypatch, remove_alice)
    call = submit(world)
    assert call.status == ToolCall.Status.QUEUED and call.grant_id == made.pk
    monkeypatch.undo()
    assert gates.gate_at_send(call) is False
    assert "granted it" in AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed").data["reason"]
    assert gate_request(call) is not None


def test_a_grant_used_outside_the_finding_transaction_is_checked_in_full(world) -> None:  # noqa: F811
    made = granted(world)
    call = submit(world)
    assert call.grant_id == made.pk
    Membership.objects.filter(user=world["alice"], team=world["release"]).delete()
    with pytest.raises(Conflict):
        grants.use(made, call)
    made.refresh_from_db()
    assert made.uses == 1


def test_a_second_revoke_after_the_first_revoker_was_deleted_does_not_blame_the_hub(world) -> None:  # noqa: F811
    made = granted(world)
    grants.revoke(grant=made, by=world["bob"])
    world["bob"].delete()
    made.refresh_from_db()
    with pytest.raises(Conflict) as refused:
        grants.revoke(grant=made, by=world["alice"])
    assert "revoked by a user since deleted at " in refused.value.message
    assert "the hub" not in refused.value.message
