"""The audit log: append-only in PostgreSQL itself, hash-chained, secrets redacted."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def strict_audit_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL elicit_hub.audit_maintenance = 'off'")


def three_events() -> list[AuditEvent]:
    srv = factories.server()
    call = factories.call(srv)
    return [
        audit.record(actor=Actor.system(), verb=f"test.step{i}", call=call, data={"i": i}) for i in range(3)
    ]


def test_rows_chain_to_the_previous_hash() -> None:
    first, second, third = three_events()
    assert second.prev_hash == first.hash
    assert third.prev_hash == second.hash
    assert audit.verify().ok
    assert audit.verify().checked == 3


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE approvals_auditevent SET verb = 'tampered'",
        "DELETE FROM approvals_auditevent",
        "TRUNCATE approvals_auditevent",
    ],
)
def test_the_database_refuses_to_change_or_remove_events(statement: str) -> None:
    three_events()
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert AuditEvent.objects.count() == 3


def test_verify_audit_names_a_row_altered_behind_the_triggers_back() -> None:
    _, second, _ = three_events()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute("UPDATE approvals_auditevent SET data = '{\"i\": 42}' WHERE id = %s", [second.id])
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    report = audit.verify()
    assert report.first_bad_id == second.id
    with pytest.raises(CommandError, match=f"#{second.id}"):
        call_command("verify_audit")


def test_verify_audit_notices_a_removed_row() -> None:
    _, second, third = three_events()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute("DELETE FROM approvals_auditevent WHERE id = %s", [second.id])
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    assert audit.verify().first_bad_id == third.id


def test_secrets_are_redacted_at_any_depth() -> None:
    event = audit.record(
        actor=Actor.system(),
        verb="test.secret",
        data={"requestState": "S1", "nested": {"api_key": "S2", "ok": "visible"}, "list": [{"token": "S3"}]},
    )
    stored = AuditEvent.objects.get(pk=event.pk).data
    assert "S1" not in str(stored) and "S2" not in str(stored) and "S3" not in str(stored)
    assert stored["nested"]["ok"] == "visible"


def test_verbs_must_be_namespaced() -> None:
    with pytest.raises(ValueError, match="namespaced"):
        audit.record(actor=Actor.system(), verb="submitted")
