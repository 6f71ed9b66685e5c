"""The audit chain's tail: no session can cut it with DML, and a cut made behind the triggers' back (by the
table's owner or a superuser) is reported by the hourly check and ``verify_audit`` from the head the previous
check recorded outside the audit table."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from approvals.audit import core as audit
from approvals.audit import tasks as audit_tasks
from approvals.audit.core import Actor
from approvals.models import AuditEvent, AuditHead

pytestmark = pytest.mark.django_db


def make(n: int, **data: object) -> list[AuditEvent]:
    return [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"n": i, **data})
        for i in range(n)
    ]


def behind_the_triggers(statement: str, params: list[object] | None = None) -> None:
    """What the table's owner (or a superuser) can always do: switch the triggers off around a statement."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute(statement, params)
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")


def refused(statement: str, params: list[object] | None = None, *, flag: bool = True) -> None:
    with (
        pytest.raises(DatabaseError, match=r"append-only|only moves forward"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        if flag:  # the old bypass, open to any session
            cursor.execute("SET LOCAL elicit_hub.audit_maintenance = 'on'")
        cursor.execute(statement, params)


def test_a_cut_tail_is_reported_by_the_hourly_check_and_verify_audit(capsys) -> None:
    events = make(5)
    assert audit_tasks.verify_chain()["ok"]
    assert AuditHead.objects.get().head_id == events[-1].id
    behind_the_triggers("DELETE FROM approvals_auditevent WHERE id >= %s", [events[3].id])
    assert audit.verify().ok  # the chain alone cannot see it: what is left links up perfectly

    state = audit_tasks.verify_chain()
    assert not state["ok"] and state["first_bad_id"] == events[-1].id
    assert "tail was cut" in state["problem"] and f"#{events[2].id}" in state["problem"]
    assert audit.last_chain_state() == state
    with pytest.raises(CommandError, match=rf"#{events[-1].id}: .*tail was cut"):
        call_command("verify_audit")
    # The record does not follow the cut back: later events do not make the cut go away.
    make(3)
    assert not audit_tasks.verify_chain()["ok"]
    assert AuditHead.objects.get().head_id == events[-1].id


def test_a_cut_of_every_event_is_reported() -> None:
    events = make(2)
    call_command("verify_audit")
    behind_the_triggers("DELETE FROM approvals_auditevent")
    report = audit.check_chain()
    assert report.first_bad_id == events[-1].id and "tail was cut" in report.problem


def test_a_tail_rewritten_with_recomputed_hashes_is_reported_without_a_saved_head() -> None:
    events = make(3)
    audit.check_chain()
    last = events[-1]
    last.data = {"n": "rewritten"}
    last.hash = audit.compute_hash(last)
    behind_the_triggers(
        "UPDATE approvals_auditevent SET data = %s, hash = %s WHERE id = %s",
        [json.dumps(last.data), last.hash, last.id],
    )
    assert audit.verify().ok
    report = audit.check_chain()
    assert report.first_bad_id == last.id and "rewritten" in report.problem


def test_verify_audit_says_the_recorded_head_is_there_and_moves_it_forward(capsys) -> None:
    first = make(2)
    call_command("verify_audit")
    assert "recorded" not in capsys.readouterr().out  # nothing recorded before the first check
    later = make(2)
    call_command("verify_audit")
    assert f"the head the last check recorded (#{first[-1].id}) is still there" in capsys.readouterr().out
    assert AuditHead.objects.get().head_id == later[-1].id


def test_a_prune_that_removes_the_recorded_head_is_not_a_cut() -> None:
    make(3)
    audit.check_chain()
    result = audit.prune(before=timezone.now(), actor=Actor.system())
    assert result is not None and result.event is not None
    report = audit.check_chain()
    assert report.ok and report.head_id == result.event.id
    call_command("prune_audit", before=timezone.now().isoformat())
    assert audit.check_chain().ok


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM approvals_auditevent",
        "DELETE FROM approvals_auditevent WHERE id = (SELECT max(id) FROM approvals_auditevent)",
        "UPDATE approvals_auditevent SET verb = 'tampered'",
        "TRUNCATE approvals_auditevent",
    ],
)
def test_the_maintenance_flag_no_longer_opens_the_table(statement: str) -> None:
    make(3)
    refused(statement)
    assert AuditEvent.objects.count() == 3


def test_after_a_prune_the_newest_event_and_unrecorded_ranges_stay() -> None:
    old = make(3)
    cutoff = timezone.now()
    kept = make(2)
    result = audit.prune(before=cutoff, actor=Actor.system())
    assert result is not None and result.event is not None
    assert AuditEvent.objects.filter(id__lte=old[-1].id).count() == 0
    # The audit.pruned event is now the newest: neither it nor anything it does not name may go.
    refused("DELETE FROM approvals_auditevent WHERE id = %s", [result.event.id])
    refused("DELETE FROM approvals_auditevent WHERE id <= %s", [kept[0].id])
    refused("DELETE FROM approvals_auditevent")
    # Nor does writing a fake prune record make a cut silent: the DELETE must leave that record standing.
    forged = audit.record(actor=Actor.system(), verb=audit.PRUNED, data={"last_id": kept[-1].id + 10**6})
    refused("DELETE FROM approvals_auditevent WHERE id <= %s", [kept[-1].id], flag=False)
    assert AuditEvent.objects.filter(pk=forged.pk).exists()


def test_a_prune_removes_exactly_the_prefix_its_record_names() -> None:
    old = make(4)
    make(1)
    # The retention code's own shape, by hand: record first, then delete a part of the recorded range only.
    audit.record(actor=Actor.system(), verb=audit.PRUNED, data={"last_id": old[-1].id})
    refused("DELETE FROM approvals_auditevent WHERE id <= %s", [old[1].id], flag=False)
    assert AuditEvent.objects.count() == 6


def test_the_recorded_head_only_moves_forward() -> None:
    make(2)
    audit.check_chain()
    refused("UPDATE approvals_audithead SET head_id = head_id - 1")
    refused("DELETE FROM approvals_audithead")
    refused("TRUNCATE approvals_audithead")
    assert AuditHead.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_test_flush_leaves_the_truncate_triggers_on() -> None:
    make(2)
    call_command("flush", interactive=False)
    assert AuditEvent.objects.count() == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname, tgenabled FROM pg_trigger WHERE tgname IN "
            "('approvals_audit_no_truncate', 'approvals_audithead_no_truncate')"
        )
        assert sorted(cursor.fetchall()) == [
            ("approvals_audit_no_truncate", "O"),
            ("approvals_audithead_no_truncate", "O"),
        ]


def test_the_hourly_check_walks_only_what_came_after_the_recorded_head() -> None:
    events = make(5)
    full = audit_tasks.verify_chain(full=True)
    assert full["ok"] and full["since_id"] is None and full["checked"] >= 5
    newer = make(3)

    state = audit_tasks.verify_chain()

    assert state["ok"] and state["since_id"] == events[-1].id
    assert state["checked"] == 3 and state["head_id"] == newer[-1].id
    assert state["full_checked_at"] == full["full_checked_at"]  # the last whole walk, kept for the page
    assert AuditHead.objects.get().head_id == newer[-1].id
    quiet = audit_tasks.verify_chain()  # nothing new: the head is checked, nothing walked
    assert quiet["ok"] and quiet["checked"] == 0 and quiet["head_id"] == newer[-1].id


REWRITE_DATA = """UPDATE approvals_auditevent SET data = '{"x": 1}' WHERE id = %s"""


def test_the_hourly_check_catches_a_new_event_rewritten_and_a_rewritten_head() -> None:
    events = make(4)
    audit_tasks.verify_chain(full=True)
    newer = make(2)
    behind_the_triggers(REWRITE_DATA, [newer[0].id])
    broken = audit_tasks.verify_chain()
    assert not broken["ok"] and broken["first_bad_id"] == newer[0].id

    behind_the_triggers("UPDATE approvals_auditevent SET hash = %s WHERE id = %s", ["0" * 64, events[-1].id])
    rewritten = audit_tasks.verify_chain()  # the recorded head changed: the whole chain is walked
    assert not rewritten["ok"] and rewritten["since_id"] is None


def test_an_older_event_rewritten_is_left_to_the_daily_full_walk() -> None:
    events = make(4)
    audit_tasks.verify_chain(full=True)
    make(1)
    behind_the_triggers(REWRITE_DATA, [events[1].id])
    assert audit_tasks.verify_chain()["ok"]  # the documented limit of the hourly check
    full = audit_tasks.verify_chain(full=True)
    assert not full["ok"] and full["first_bad_id"] == events[1].id


def test_beat_runs_the_hourly_check_and_a_daily_full_walk(settings) -> None:
    schedule = settings.CELERY_BEAT_SCHEDULE
    hourly, daily = schedule["verify-audit-chain"], schedule["verify-audit-chain-full"]
    assert hourly["task"] == daily["task"] == "approvals.audit.tasks.verify_chain"
    assert hourly["schedule"] == 3600.0 and not hourly.get("kwargs")
    assert daily["schedule"] == 86400.0 and daily["kwargs"] == {"full": True}
