"""What a check of a tampered audit chain tells the person reading it: where the break is, both its ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import AuditEvent

pytestmark = pytest.mark.django_db


def make(n: int) -> list[AuditEvent]:
    return [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"n": i}) for i in range(n)
    ]


def behind_the_triggers(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute(statement, params)
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")


def rewrite_with_its_hash_recomputed(event: AuditEvent) -> None:
    event.data = {"n": "rewritten"}
    event.hash = audit.compute_hash(event)
    behind_the_triggers(
        "UPDATE approvals_auditevent SET data = %s, hash = %s WHERE id = %s",
        [json.dumps(event.data), event.hash, event.id],
    )


def test_an_event_rewritten_with_its_hash_recomputed_is_named_with_the_event_after_it() -> None:
    """The rewritten event verifies alone: the break shows on the next one, and the report must name the
    event before the break too, or the reader looks at an untouched event."""
    _, second, third, _ = make(4)
    rewrite_with_its_hash_recomputed(second)
    report = audit.verify()
    assert report.first_bad_id == third.id
    assert f"event #{second.id} before it" in report.problem
    assert f"#{second.id} or #{third.id} was rewritten" in report.problem
    with pytest.raises(CommandError, match=f"#{second.id} or #{third.id} was rewritten"):
        call_command("verify_audit")


def test_events_removed_from_the_middle_are_named_by_the_events_around_them() -> None:
    first, second, third, fourth = make(4)
    behind_the_triggers("DELETE FROM approvals_auditevent WHERE id IN (%s, %s)", [second.id, third.id])
    report = audit.verify()
    assert report.first_bad_id == fourth.id
    assert f"the events between #{first.id} and #{fourth.id} were removed" in report.problem


def test_the_first_events_removed_are_reported_as_missing_before_the_chains_start() -> None:
    first, second, _ = make(3)
    behind_the_triggers("DELETE FROM approvals_auditevent WHERE id = %s", [first.id])
    report = audit.verify()
    assert report.first_bad_id == second.id
    assert "its prev_hash is not the chain's start: the events before it were removed" in report.problem


def test_the_hourly_check_names_the_recorded_head_when_the_events_after_it_are_removed() -> None:
    head = make(3)[-1]
    assert audit.check_chain().head_id == head.id  # recorded
    after = make(3)
    behind_the_triggers("DELETE FROM approvals_auditevent WHERE id = %s", [after[0].id])
    report = audit.check_chain(full=False)
    assert report.since_id == head.id
    assert report.first_bad_id == after[1].id
    assert f"the events between #{head.id} and #{after[1].id} were removed" in report.problem


def test_a_saved_head_cut_away_with_the_recorded_one_is_reported_as_gone(tmp_path: Path, capsys) -> None:
    """The table's owner can cut the tail and rewrite the head the checks record: the head saved elsewhere
    must say its event is gone, not that it was rewritten."""
    events = make(4)
    call_command("export_audit_head")
    saved = tmp_path / "head.json"
    saved.write_text(capsys.readouterr().out)
    behind_the_triggers("DELETE FROM approvals_auditevent WHERE id >= %s", [events[2].id])
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_audithead DISABLE TRIGGER USER")
        cursor.execute("DELETE FROM approvals_audithead")
        cursor.execute("ALTER TABLE approvals_audithead ENABLE TRIGGER USER")
    with pytest.raises(CommandError, match=f"event #{events[3].id}, the saved head, is gone"):
        call_command("verify_audit", head=saved)


def test_verify_audit_says_what_it_found_while_redis_is_down(redis_down: None, capsys) -> None:
    """Redis only keeps the result for the audit page: the check itself, and its verdict, need only the
    database."""
    _, second, _ = make(3)
    call_command("verify_audit")
    assert "audit chain intact: 3 events verified" in capsys.readouterr().out
    rewrite_with_its_hash_recomputed(second)
    with pytest.raises(CommandError, match=f"audit chain broken at event #{second.id + 1}"):
        call_command("verify_audit")


def test_export_audit_head_refuses_to_save_the_head_of_a_cut_chain(capsys) -> None:
    """A chain whose newest events were cut still verifies: saving its head as the one to trust would make
    the cut the chain's own."""
    events = make(4)
    call_command("verify_audit")  # records the head, #4
    behind_the_triggers("DELETE FROM approvals_auditevent WHERE id >= %s", [events[2].id])
    capsys.readouterr()
    with pytest.raises(CommandError, match=f"event #{events[3].id}: .*the chain's tail was cut"):
        call_command("export_audit_head")
    assert capsys.readouterr().out == ""
