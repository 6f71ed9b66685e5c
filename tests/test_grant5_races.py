"""Grants under real concurrency on PostgreSQL, each side on its own connection: a use racing a revoke, a
revoke racing a use the gate has locked, and two calls using one grant at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, transaction

from approvals.models import AuditEvent, Grant, ToolCall
from approvals.services import grants
from approvals.services.errors import Conflict
from tests.live import wait_until
from tests.test_ggx_grantor import granted_by, submit, world  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


class Side(threading.Thread):
    """``work`` on a connection of its own; what it returned or raised is kept."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # handed to the test
            self.error = exc
        finally:
            connections.close_all()

    def outcome(self) -> Any:
        self.join(timeout=30)
        assert not self.is_alive(), "the thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def waiting_on_a_grant_row(statement: str) -> bool:
    """Whether another session waits for a lock in a statement starting so."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND query LIKE %s",
            [statement + "%"],
        )
        return cursor.fetchone()[0] > 0


def test_a_use_waiting_on_a_revoke_in_progress_is_refused_once_the_revoke_commits(world) -> None:  # noqa: F811
    made = granted_by(world, "alice")
    call = submit(world)
    assert call.grant_id == made.pk  # used once
    revoked, commit = threading.Event(), threading.Event()

    def revoke() -> None:
        with transaction.atomic():
            grants.revoke(grant=Grant.objects.get(pk=made.pk), by=world["bob"])
            revoked.set()
            assert commit.wait(timeout=30)

    revoking = Side(revoke)
    revoking.start()
    assert revoked.wait(timeout=30)
    # A use recorded outside the gate's transaction: it found the grant before the revoke.
    using = Side(lambda: grants.use(Grant.objects.get(pk=made.pk), call))
    using.start()
    wait_until(lambda: waiting_on_a_grant_row('UPDATE "approvals_grant"'), 30, what="the use to wait")
    commit.set()
    revoking.outcome()
    with pytest.raises(Conflict):
        using.outcome()
    made.refresh_from_db()
    assert made.revoked_at is not None and made.uses == 1
    assert AuditEvent.objects.filter(verb="gate.granted").count() == 1


def test_a_revoke_racing_a_granted_submit_waits_and_counts_the_use(world) -> None:  # noqa: F811
    made = granted_by(world, "alice")
    found, finish = threading.Event(), threading.Event()
    original = grants.find

    def find_then_hold(**kwargs: Any) -> Grant | None:
        result = original(**kwargs)
        found.set()
        assert finish.wait(timeout=30)
        return result

    grants.find = find_then_hold  # type: ignore[assignment]
    try:
        submitting = Side(lambda: submit(world))
        submitting.start()
        assert found.wait(timeout=30)
    finally:
        grants.find = original  # type: ignore[assignment]
    revoking = Side(lambda: grants.revoke(grant=Grant.objects.get(pk=made.pk), by=world["bob"]))
    revoking.start()
    wait_until(lambda: waiting_on_a_grant_row('UPDATE "approvals_grant"'), 30, what="the revoke to wait")
    finish.set()
    call = submitting.outcome()
    revoking.outcome()
    # The call was let through before the grant was revoked, and the revoke's record counts it.
    assert call.grant_id == made.pk and call.status == ToolCall.Status.QUEUED
    made.refresh_from_db()
    assert made.uses == 1 and made.revoked_at is not None
    assert AuditEvent.objects.get(verb="grant.revoked").data["uses"] == 1
    assert submit(world).status == ToolCall.Status.AWAITING_INPUT


def test_two_calls_using_one_grant_at_once_are_both_counted_and_audited(world) -> None:  # noqa: F811
    made = granted_by(world, "alice")
    start = threading.Barrier(2)

    def one() -> ToolCall:
        start.wait(timeout=30)
        return submit(world)

    sides = [Side(one), Side(one)]
    for side in sides:
        side.start()
    made_calls = [side.outcome() for side in sides]
    assert all(c.grant_id == made.pk and c.status == ToolCall.Status.QUEUED for c in made_calls)
    made.refresh_from_db()
    assert made.uses == 2
    assert AuditEvent.objects.filter(verb="gate.granted").count() == 2
