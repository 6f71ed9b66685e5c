"""Retention: prune_audit removes only the oldest events, records what it removed, and the chain still
verifies (a new segment starts at the first kept event); tampering is still caught."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from django.utils import timezone

from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import AuditEvent

pytestmark = pytest.mark.django_db


def make(n: int, **data: object) -> list[AuditEvent]:
    return [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"n": i, **data})
        for i in range(n)
    ]


def test_a_retention_run_removes_only_what_it_says_and_the_chain_still_verifies(capsys) -> None:
    old = make(4, age="old")
    cutoff = timezone.now()
    kept = make(3, age="new")
    call_command("prune_audit", before=cutoff.isoformat())
    out = capsys.readouterr().out
    assert f"removed 4 events #{old[0].id}..#{old[-1].id} (last hash {old[-1].hash})" in out
    remaining = list(AuditEvent.objects.order_by("id"))
    assert [e.id for e in remaining[:-1]] == [e.id for e in kept]
    pruned = remaining[-1]
    assert pruned.verb == "audit.pruned" and f"recorded as event #{pruned.id}" in out
    assert pruned.data["count"] == 4
    assert (pruned.data["first_id"], pruned.data["last_id"]) == (old[0].id, old[-1].id)
    assert pruned.data["last_hash"] == old[-1].hash == kept[0].prev_hash  # the new segment's anchor
    assert pruned.data["first_prev_hash"] == audit.GENESIS
    report = audit.verify()
    assert report.ok and report.checked == 4 and report.anchor == old[-1].hash
    call_command("verify_audit")


def test_a_second_run_prunes_from_the_first_ones_anchor() -> None:
    first = make(2)
    audit.prune(before=timezone.now(), actor=Actor.system())
    second = make(2)
    result = audit.prune(before=timezone.now(), actor=Actor.system())
    assert result is not None and result.count == 3  # two events and the first audit.pruned
    assert result.event.data["first_prev_hash"] == first[-1].hash
    assert result.event.data["last_id"] == second[-1].id
    assert list(AuditEvent.objects.values_list("verb", flat=True)) == ["audit.pruned"]
    assert audit.verify().ok


def test_only_the_oldest_part_of_the_chain_goes_even_behind_a_lagging_clock(monkeypatch) -> None:
    old = make(2)
    cutoff = timezone.now()
    newer = make(1)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: cutoff - timedelta(hours=1))
    late = make(1)  # written after a kept event by a host whose clock lags: older than the cutoff
    monkeypatch.setattr(timezone, "now", real_now)
    assert late[0].at < cutoff
    result = audit.prune(before=cutoff, actor=Actor.system())
    assert result is not None and (result.first_id, result.last_id) == (old[0].id, old[-1].id)
    assert AuditEvent.objects.filter(pk__in=[newer[0].pk, late[0].pk]).count() == 2
    assert audit.verify().ok


def test_a_dry_run_removes_nothing(capsys) -> None:
    old = make(3)
    call_command("prune_audit", before=timezone.now().isoformat(), dry_run=True)
    assert f"would remove 3 events #{old[0].id}..#{old[-1].id}" in capsys.readouterr().out
    assert AuditEvent.objects.count() == 3


def test_nothing_older_than_the_retention_period_means_nothing_removed(capsys) -> None:
    make(2)
    with override_settings(ELICIT_AUDIT_RETENTION_DAYS=30):
        call_command("prune_audit")
    assert "nothing to remove" in capsys.readouterr().out
    assert AuditEvent.objects.count() == 2


def test_the_retention_setting_sets_the_cutoff(monkeypatch, capsys) -> None:
    old = make(2)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(days=31))
    with override_settings(ELICIT_AUDIT_RETENTION_DAYS=30):
        call_command("prune_audit")
    monkeypatch.setattr(timezone, "now", real_now)
    assert f"removed 2 events #{old[0].id}..#{old[-1].id}" in capsys.readouterr().out


def test_a_tampered_row_still_fails_after_a_prune() -> None:
    make(2)
    cutoff = timezone.now()
    kept = make(3)
    audit.prune(before=cutoff, actor=Actor.system())
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute("UPDATE approvals_auditevent SET data = '{\"n\": 9}' WHERE id = %s", [kept[1].id])
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    assert audit.verify().first_bad_id == kept[1].id


def test_removing_more_than_the_prune_recorded_is_caught() -> None:
    make(2)
    cutoff = timezone.now()
    kept = make(3)
    audit.prune(before=cutoff, actor=Actor.system())
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute("DELETE FROM approvals_auditevent WHERE id = %s", [kept[0].id])
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    report = audit.verify()
    assert report.first_bad_id == kept[1].id and "prev_hash" in report.problem


def test_a_broken_chain_is_not_pruned_away() -> None:
    old = make(3)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute("UPDATE approvals_auditevent SET data = '{\"n\": 7}' WHERE id = %s", [old[1].id])
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    with pytest.raises(CommandError, match=f"refusing to prune.*#{old[1].id}"):
        call_command("prune_audit", before=timezone.now().isoformat())
    assert AuditEvent.objects.count() == 3


def test_deleting_is_refused_again_after_a_prune() -> None:
    make(2)
    audit.prune(before=timezone.now(), actor=Actor.system())
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.all().delete()


def test_a_saved_chain_head_shows_a_rewritten_chain(tmp_path, capsys) -> None:
    make(3)
    call_command("export_audit_head")
    head = json.loads(capsys.readouterr().out)
    saved = tmp_path / "head.json"
    saved.write_text(json.dumps(head))
    call_command("verify_audit", head=saved)
    assert "matches" in capsys.readouterr().out
    # Rewrite the whole chain consistently (every hash recomputed): only the saved head can tell.
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        previous = audit.GENESIS
        for event in AuditEvent.objects.order_by("id"):
            event.data = {"rewritten": True}
            event.prev_hash = previous
            event.hash = previous = audit.compute_hash(event)
            cursor.execute(
                "UPDATE approvals_auditevent SET data = %s, prev_hash = %s, hash = %s WHERE id = %s",
                [json.dumps(event.data), event.prev_hash, event.hash, event.id],
            )
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    assert audit.verify().ok
    with pytest.raises(CommandError, match="rewritten"):
        call_command("verify_audit", head=saved)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(CommandError, match="ISO 8601"):
        call_command("prune_audit", before="last tuesday")
    with pytest.raises(CommandError, match="at least 1 day"):
        call_command("prune_audit", days=0)
