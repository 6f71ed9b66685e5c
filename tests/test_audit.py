"""The audit log: append-only in PostgreSQL itself, hash-chained, secrets redacted."""

from __future__ import annotations

import ast
import contextlib
import io
import threading
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from approvals.audit import core as audit
from approvals.audit import verbs
from approvals.audit.core import Actor
from approvals.audit.forms import AuditFilterForm
from approvals.audit.queries import filter_events
from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db


def three_events() -> list[AuditEvent]:
    srv = factories.server()
    call = factories.call(srv)
    return [
        audit.record(actor=Actor.system(), verb="call.retry_scheduled", call=call, data={"i": i})
        for i in range(3)
    ]


def test_rows_chain_to_the_previous_hash() -> None:
    first, second, third = three_events()
    assert second.prev_hash == first.hash
    assert third.prev_hash == second.hash
    assert audit.verify().ok
    assert audit.verify().checked == 3


def test_a_batch_joins_the_chain_together_in_the_order_recorded() -> None:
    before = audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"i": "before"})
    with transaction.atomic(), audit.batched():
        events = [
            audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"i": i}) for i in range(3)
        ]
        with audit.batched():  # nested: the outer block writes
            events.append(audit.record(actor=Actor.system(), verb="call.moved_to_session", data={}))
        assert AuditEvent.objects.count() == 1  # nothing written before the block ends
    rows = list(AuditEvent.objects.order_by("id"))
    assert [r.data.get("i") for r in rows] == ["before", 0, 1, 2, None]
    assert [r.id for r in rows[1:]] == [before.id + n for n in range(1, 5)]
    assert [r.prev_hash for r in rows[1:]] == [r.hash for r in rows[:-1]]
    assert [e.hash for e in events] == [r.hash for r in rows[1:]]
    after = audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"i": "after"})
    assert after.prev_hash == rows[-1].hash
    assert audit.verify().ok and audit.verify().checked == 6


def test_a_batch_that_raises_writes_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic(), audit.batched():
        audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"i": 1})
        raise RuntimeError("the step failed")
    assert AuditEvent.objects.count() == 0
    audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"i": 2})
    assert audit.verify().ok


def test_batches_and_single_appends_from_many_connections_keep_one_chain(live_db) -> None:
    barrier = threading.Barrier(4)

    def writer(name: str, batch: bool) -> None:
        try:
            barrier.wait()
            with transaction.atomic(), audit.batched() if batch else contextlib.nullcontext():
                for i in range(3):
                    audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"w": name, "i": i})
        finally:
            connection.close()

    threads = [
        threading.Thread(target=writer, args=(name, name.startswith("batch")))
        for name in ("batch-a", "batch-b", "single-c", "single-d")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    rows = list(AuditEvent.objects.order_by("id").values_list("data", flat=True))
    assert len(rows) == 12 and audit.verify().ok
    for name in ("batch-a", "batch-b"):  # a batch's events are consecutive in the chain
        at = [n for n, data in enumerate(rows) if data["w"] == name]
        assert at == list(range(at[0], at[0] + 3))


def test_an_append_that_waited_for_the_lock_links_to_the_append_it_waited_for(live_db) -> None:
    """The lock and the read of the chain's head are one round trip: the read must still come after the
    grant, and see the append that held the lock and committed meanwhile."""
    first_recorded, release = threading.Event(), threading.Event()
    events: dict[str, AuditEvent] = {}

    def holder() -> None:
        try:
            with transaction.atomic():
                events["first"] = audit.record(
                    actor=Actor.system(), verb="call.retry_scheduled", data={"n": 1}
                )
                first_recorded.set()
                release.wait(30)  # the chain lock is held until this commits
        finally:
            connection.close()

    def waiter() -> None:
        try:
            events["second"] = audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"n": 2})
        finally:
            connection.close()

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    threads[0].start()
    assert first_recorded.wait(30)
    threads[1].start()
    with connection.cursor() as cursor:  # the second append is waiting for the lock, its statement sent
        for _ in range(300):
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            if cursor.fetchone()[0]:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the second append never waited for the chain's lock")
    release.set()
    for thread in threads:
        thread.join(30)
    assert events["second"].prev_hash == events["first"].hash
    assert events["second"].id > events["first"].id
    assert audit.verify().ok and audit.verify().checked == 2


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
        verb="server.tools_refreshed",
        data={"requestState": "S1", "nested": {"api_key": "S2", "ok": "visible"}, "list": [{"token": "S3"}]},
    )
    stored = AuditEvent.objects.get(pk=event.pk).data
    assert "S1" not in str(stored) and "S2" not in str(stored) and "S3" not in str(stored)
    assert stored["nested"]["ok"] == "visible"


@pytest.mark.parametrize(
    "key",
    [
        "smtp_pass",
        "DB_PASS",
        "smtpPass",
        "userPin2",
        "pass",
        "pwd",
        "user-pw",
        "pin1",
        "passphrase",
        "privateKey",
        "ssh_private_key",
    ],
)
def test_short_secret_names_are_redacted(key: str) -> None:
    event = audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"arguments": {key: "S1"}})
    assert AuditEvent.objects.get(pk=event.pk).data["arguments"][key] == audit.REDACTED


def test_words_that_merely_contain_a_secret_name_stay() -> None:
    data = {"pass_rate": 0.9, "passed": True, "spin": 3, "pinned": "yes", "compass": "north", "Spin": 1}
    event = audit.record(actor=Actor.system(), verb="server.tools_refreshed", data=data)
    assert AuditEvent.objects.get(pk=event.pk).data == data


def test_verbs_must_be_namespaced() -> None:
    with pytest.raises(ValueError, match="namespaced"):
        audit.record(actor=Actor.system(), verb="submitted")


def test_unregistered_verbs_are_refused() -> None:
    with pytest.raises(ValueError, match="registry of audit verbs"):
        audit.record(actor=Actor.system(), verb="call.teleported")
    assert not AuditEvent.objects.exists()


def test_the_filter_offers_every_registered_verb_and_noun() -> None:
    field = AuditFilterForm().fields["verb"]
    offered = {value for _, group in field.choices[1:] for value, _ in group}
    assert offered == {*verbs.VERBS, *(f"{noun}.*" for noun in verbs.NOUNS)}
    assert {"input.routed", "input.escalated", "server.tools_refreshed"} <= offered


def test_a_kind_of_event_finds_every_verb_of_its_noun() -> None:
    call = factories.call(factories.server())
    written = {
        verb: audit.record(actor=Actor.system(), verb=verb, call=call).id
        for verb in ("input.requested", "input.routed", "input.refused", "input.approved", "input.escalated")
    }
    audit.record(actor=Actor.system(), verb="round.opened", call=call)
    found = set(filter_events(AuditEvent.objects.all(), {"verb": "input.*"}).values_list("id", flat=True))
    assert found == set(written.values())
    form = AuditFilterForm({"verb": "server.tools_refreshed"})
    assert form.is_valid(), form.errors


# --- every verb the code writes is registered, and every registered verb is written somewhere ------------

SOURCE = Path(__file__).resolve().parent.parent / "approvals"


def _constants(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level names bound to a string, or to a dict of strings (its values)."""
    found: dict[str, list[str]] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if not isinstance(target, ast.Name) or value is None:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = [value.value]
        elif isinstance(value, ast.Dict):
            found[target.id] = [v.value for v in value.values if isinstance(v, ast.Constant)]
    return found


def _verbs_of(node: ast.expr, constants: dict[str, list[str]]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _verbs_of(node.body, constants) + _verbs_of(node.orelse, constants)
    if isinstance(node, ast.BoolOp):
        return [verb for value in node.values for verb in _verbs_of(value, constants)]
    if isinstance(node, ast.Name):
        return constants.get(node.id, [])
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        return constants.get(node.value.id, [])
    return []


def verbs_written(source: str) -> set[str]:
    """The verbs given to ``record`` (or to ``call_finish``, which records) anywhere in one module."""
    tree = ast.parse(source)
    constants = _constants(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in {"record", "call_finish"}:
                for keyword in node.keywords:
                    if keyword.arg == "verb":
                        found.update(_verbs_of(keyword.value, constants))
    return found


def test_the_scan_finds_verbs_however_they_are_spelled() -> None:
    source = """
PRUNED = "audit.pruned"
FINAL = {"a": "call.completed", "b": "call.failed"}
def f(problem, verb=None):
    audit.record(actor=x, verb="input.unsupported" if problem else "input.requested")
    audit.record(actor=x, verb=PRUNED)
    call_finish(call=c, verb=verb or FINAL[status])
"""
    assert verbs_written(source) == {
        "input.unsupported",
        "input.requested",
        "audit.pruned",
        "call.completed",
        "call.failed",
    }


def test_every_verb_written_is_registered_and_every_registered_verb_is_written() -> None:
    written: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        if "migrations" not in path.parts:
            written |= verbs_written(path.read_text(encoding="utf-8"))
    assert written - set(verbs.VERBS) == set()
    assert set(verbs.VERBS) - written == set()


def test_append_many_extends_the_chain_as_record_does() -> None:
    from datetime import timedelta

    from django.utils import timezone

    first = audit.record(actor=Actor.system(), verb="call.submitted")
    at = timezone.now() - timedelta(days=3)
    system = {"actor_type": "system", "actor_id": "", "actor_label": "hub"}
    rows = [
        {**system, "at": at, "verb": "call.retry_scheduled", "data": {"code": "timeout"}},
        {**system, "at": at, "verb": "input.answered", "data": {"action": "decline", "token": "S3"}},
        {**system, "at": at, "verb": "call.failed", "server_slug": "deploy", "data": {}},
    ]
    assert audit.append_many(rows) == 3
    last = audit.record(actor=Actor.system(), verb="call.cancelled")

    events = list(AuditEvent.objects.order_by("id"))
    assert [e.verb for e in events] == ["call.submitted", *(r["verb"] for r in rows), "call.cancelled"]
    assert events[1].prev_hash == first.hash and last.prev_hash == events[3].hash
    assert (events[2].action, events[2].outcome) == ("decline", "answered")
    assert events[2].data["token"] == "[redacted]" and events[3].server_slug == "deploy"
    assert audit.verify().ok and audit.verify().checked == 5
    with pytest.raises(ValueError, match="registry of audit verbs"):
        audit.append_many([{**system, "at": at, "verb": "call.teleported", "data": {}}])
    assert AuditEvent.objects.count() == 5


def test_the_audit_seeder_writes_a_chain_that_verifies() -> None:
    from bench import seed_audit

    call_command(seed_audit.Command(), count=120, batch=50, days=2.0, stdout=io.StringIO())
    assert AuditEvent.objects.count() == 120
    assert audit.verify().ok
    assert {"call.submitted", "input.requested", "round.opened"} <= set(
        AuditEvent.objects.values_list("verb", flat=True)
    )


def test_bench_without_a_name_lists_the_benchmarks(capsys) -> None:
    from bench.__main__ import main

    assert main([]) == 2
    assert "seed_audit" in capsys.readouterr().err
