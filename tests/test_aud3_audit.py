"""The audit log as an auditor and an attacker use it: exports opened in a spreadsheet, saved heads and
prunes, secrets in addresses, and walks of a chain of large events while retention runs."""

from __future__ import annotations

import csv
import io
import json
import os
import threading
import tracemalloc
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.audit import core as audit
from approvals.audit import verify as audit_verify
from approvals.audit.core import Actor
from approvals.models import AuditEvent
from tests import factories
from tests.test_auditrev_core import download

pytestmark = pytest.mark.django_db

BOM = b"\xef\xbb\xbf"


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


def test_a_csv_export_tells_a_spreadsheet_it_is_utf8_and_still_verifies(root: Client, tmp_path: Path) -> None:
    audit.record(actor=Actor("user", "7", "Zoë Łukasz"), verb="input.answered", data={"note": "Grüße, سلام"})
    body = download(root, "csv")
    assert body.startswith(BOM + b"id,at,")  # without it Excel reads the file in the legacy code page
    rows = list(csv.DictReader(io.StringIO(body.decode("utf-8-sig"))))
    assert [row["actor_label"] for row in rows] == ["Zoë Łukasz"]
    assert json.loads(rows[0]["data"]) == {"note": "Grüße, سلام"}
    path = tmp_path / "audit.csv"
    path.write_bytes(body)
    assert audit_verify.main([str(path)]) == 0
    # Read as text by any means, the mark does not hide the header row from the verifier.
    assert audit_verify.verify_csv(body.decode().splitlines(keepends=True)).checked == 1


def test_the_byte_order_mark_is_only_for_csv(root: Client) -> None:
    audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={})
    assert download(root, "jsonl").startswith(b'{"type":"header"')  # JSON Lines forbids the mark


# --- a saved head that a prune removed ------------------------------------------------------------------


def make(n: int) -> list[AuditEvent]:
    return [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"n": i}) for i in range(n)
    ]


def save_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    call_command("export_audit_head")
    path = tmp_path / "head.json"
    path.write_text(capsys.readouterr().out)
    return path


def forge_prune(through: AuditEvent, before: datetime, last_hash: str | None = None) -> None:
    """What any session that may write the table can do: record a prune by hand, then delete what it names."""
    data = {"before": before.isoformat(), "first_id": 1, "last_id": through.id}
    audit.record(
        actor=Actor.system("prune_audit"),
        verb=audit.PRUNED,
        data={**data, "last_hash": last_hash or through.hash},
    )
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM approvals_auditevent WHERE id <= %s", [through.id])


def test_a_saved_head_a_prune_removed_is_not_said_to_match(tmp_path: Path, capsys) -> None:
    make(3)
    saved = save_head(tmp_path, capsys)
    result = audit.prune(before=timezone.now(), actor=Actor.system("prune_audit"))
    assert result is not None and result.event is not None
    call_command("verify_audit", head=saved)
    out = capsys.readouterr().out
    assert "matches" not in out
    head_id = json.loads(saved.read_text())["head_id"]
    assert f"saved head #{head_id} was removed by a prune (audit.pruned event #{result.event.id}" in out
    assert "it vouches for nothing left" in out and "audit chain intact" in out


def test_a_prune_that_claims_only_older_events_but_removed_the_saved_head_is_a_cut(
    tmp_path: Path, capsys
) -> None:
    early = timezone.now()
    events = make(4)
    saved = save_head(tmp_path, capsys)
    forge_prune(events[-1], before=early)
    audit.check_chain()  # the chain alone cannot tell: the record names what went, and the rest links to it
    with pytest.raises(
        CommandError, match=rf"event #{events[-1].id}, the saved head, is gone, .* removed only events before"
    ):
        call_command("verify_audit", head=saved)


def test_a_rewritten_head_pruned_away_is_reported_as_rewritten(tmp_path: Path, capsys) -> None:
    events = make(3)
    saved = save_head(tmp_path, capsys)
    # The table's owner rewrites the saved head's event (hash recomputed), then prunes it away.
    head = events[-1]
    head.data = {"n": "rewritten"}
    head.hash = audit.compute_hash(head)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute(
            "UPDATE approvals_auditevent SET data = %s, hash = %s WHERE id = %s",
            [json.dumps(head.data), head.hash, head.id],
        )
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    forge_prune(head, before=timezone.now())
    assert audit.verify().ok
    with pytest.raises(CommandError, match="records another hash for it"):
        call_command("verify_audit", head=saved)


def test_a_head_saved_from_an_empty_chain_vouches_for_nothing(tmp_path: Path, capsys) -> None:
    saved = save_head(tmp_path, capsys)
    make(1)
    call_command("verify_audit", head=saved)
    out = capsys.readouterr().out
    assert "the saved head is of an empty chain: it vouches for nothing" in out and "matches" not in out


# --- a prune racing the walk of the whole chain ---------------------------------------------------------


def test_a_prune_between_reading_the_chains_start_and_its_rows_is_not_a_break(monkeypatch) -> None:
    make(3)
    cutoff = timezone.now()
    kept = make(2)
    real = audit.chain_anchor
    pruned: list[audit.PruneResult | None] = []

    def start_then_prune() -> tuple[str, int | None]:
        start = real()
        if not pruned:  # the retention run commits right after the walk read the chain's start
            pruned.append(None)
            pruned[0] = audit.prune(before=cutoff, actor=Actor.system("prune_audit"))
        return start

    monkeypatch.setattr(audit, "chain_anchor", start_then_prune)
    state = audit.store_chain_state(audit.check_chain())
    result = pruned[0]
    assert result is not None and result.event is not None and result.count == 3
    assert state["ok"], state["problem"]
    assert state["checked"] == 3 and state["head_id"] == result.event.id
    assert state["anchor"] == result.last_hash and kept[0].prev_hash == result.last_hash


# --- secrets in events ----------------------------------------------------------------------------------


def test_an_addresses_password_never_reaches_the_log_or_its_exports(root: Client, tmp_path: Path) -> None:
    arguments = {
        "dsn": "postgres://app:pa55w0rd1234@db.internal/app",
        "note": "cache at redis://:p%2Fw0rd@10.0.0.5:6379/0, then mysql://u:p@ss99@h/x; docs https://alice@ex.com/a@b",
        "shown": "https://bob:***@mcp.example.com/mcp",
    }
    event = audit.record(actor=Actor.system(), verb="call.submitted", data={"arguments": arguments})
    stored = AuditEvent.objects.get(pk=event.pk).data["arguments"]
    assert stored == {
        "dsn": "postgres://app:[redacted]@db.internal/app",
        "note": "cache at redis://:[redacted]@10.0.0.5:6379/0, then mysql://u:[redacted]@h/x; docs "
        "https://alice@ex.com/a@b",
        "shown": "https://bob:***@mcp.example.com/mcp",
    }
    body = download(root, "jsonl")
    assert b"pa55w0rd1234" not in body and b"p%2Fw0rd" not in body and b"ss99" not in body
    path = tmp_path / "audit.jsonl"
    path.write_bytes(body)
    assert audit_verify.main([str(path)]) == 0
    assert audit.verify().ok


# --- a walk of the chain holds a bounded amount of it ---------------------------------------------------

LARGE = 1024 * 1024


def test_a_walk_of_events_as_large_as_a_body_holds_about_its_budget_not_thousands(monkeypatch) -> None:
    """Each event may hold a call's arguments (ELICIT_MAX_BODY, 1 MiB): read 5,000 at a time, an agent's
    large calls would take the daily walk gigabytes. Here 16 such events and a 2 MiB budget."""
    for _ in range(16):
        audit.record(
            actor=Actor.system(), verb="call.submitted", data={"arguments": os.urandom(LARGE // 2).hex()}
        )
    monkeypatch.setattr(audit, "WALK_BYTES", 2 * LARGE, raising=False)
    tracemalloc.start()
    try:
        report = audit.verify()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.ok and report.checked == 16
    assert peak < 8 * LARGE, f"{peak / LARGE:.1f} MiB held at once"


def test_a_prune_committed_while_the_whole_chain_is_walked_is_no_break(live_db: None, monkeypatch) -> None:
    """The walk reads the chain a chunk at a time: a retention run that commits meanwhile, removing events the
    walk has not reached yet, must not be reported as a removal in the middle: the walk is made again."""
    make(6)
    cutoff = timezone.now()
    make(3)
    monkeypatch.setattr(audit, "WALK_ROWS", 2)
    walked = audit.in_chunks
    pruned: list[audit.PruneResult | None] = []

    def prune_elsewhere() -> None:
        try:
            pruned.append(audit.prune(before=cutoff, actor=Actor.system("prune_audit")))
        finally:
            connection.close()

    def chunks_with_a_prune_after_the_first(*args: Any, **kwargs: Any) -> Iterator[list[dict[str, Any]]]:
        for number, chunk in enumerate(walked(*args, **kwargs)):
            yield chunk
            if number == 0 and threading.current_thread() is threading.main_thread() and not pruned:
                thread = threading.Thread(target=prune_elsewhere)
                thread.start()
                thread.join()

    monkeypatch.setattr(audit, "in_chunks", chunks_with_a_prune_after_the_first)
    report = audit.verify()
    assert pruned and pruned[0] is not None and pruned[0].count == 6  # the prune did commit mid-walk
    assert report.ok, report.problem
    recorded = pruned[0].event
    assert (
        recorded is not None and report.checked == 4 and report.head_id == recorded.id
    )  # 3 kept, the record
