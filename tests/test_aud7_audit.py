"""The audit log as an importer, an auditor checking a file and an operator reading a prune see it."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit import verify as audit_verify
from approvals.audit.core import Actor
from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db

SYSTEM = {"actor_type": "system", "actor_id": "", "actor_label": "import"}
CALL = uuid.UUID("6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f")


# --- an import writes a chain that verifies, whatever clock or spelling its rows come in -------------------


@pytest.mark.parametrize(
    "row",
    [
        {"at": datetime(2026, 3, 1, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))},
        {"at": datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=ZoneInfo("America/St_Johns"))},
        {"at": "2026-03-01T12:00:00Z"},
        {"at": "2026-03-01T12:00:00.5+05:30"},
        {"at": datetime(2026, 3, 1, 12, 0, tzinfo=UTC), "call_id": str(CALL).upper()},
        {"at": datetime(2026, 3, 1, 12, 0, tzinfo=UTC), "input_request_id": CALL.hex},
    ],
    ids=["berlin", "st-johns-microseconds", "iso-z", "iso-offset", "upper-case-call", "hex-request"],
)
def test_an_import_in_any_zone_or_spelling_writes_a_chain_that_verifies(row: dict) -> None:
    audit.record(actor=Actor.system(), verb="call.submitted")
    audit.append_many([{**SYSTEM, "verb": "call.retry_scheduled", "data": {}, **row}])
    audit.record(actor=Actor.system(), verb="call.cancelled")
    report = audit.verify()
    assert report.ok, report.problem
    assert report.checked == 3
    imported = AuditEvent.objects.order_by("id")[1]
    at = row["at"] if isinstance(row["at"], datetime) else datetime.fromisoformat(row["at"])
    assert imported.at == at  # the same instant, read back in UTC
    if "call_id" in row or "input_request_id" in row:
        assert CALL in (imported.call_id, imported.input_request_id)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"at": datetime(2026, 3, 1, 12, 0)}, "at must be a date-time with its UTC offset"),
        ({"at": "2026-03-01 12:00"}, "at must be a date-time with its UTC offset"),
        ({"at": "yesterday"}, "at is not an ISO 8601 time"),
        ({"actor_id": 5}, "actor_id must be text, not a int"),
        ({"actor_type": "robot"}, "actor_type 'robot' is not user, agent or system"),
        ({"call_id": "call-7"}, "call_id is not a UUID"),
    ],
)
def test_an_import_row_that_would_never_verify_is_refused_and_nothing_is_written(
    row: dict, problem: str
) -> None:
    first = audit.record(actor=Actor.system(), verb="call.submitted")
    good = {**SYSTEM, "at": datetime(2026, 3, 1, tzinfo=UTC), "verb": "call.retry_scheduled", "data": {}}
    with pytest.raises(ValueError, match=f"imported audit event 1: {problem}"):
        audit.append_many([good, {**good, **row}])
    assert list(AuditEvent.objects.values_list("id", flat=True)) == [first.id]
    audit.record(actor=Actor.system(), verb="call.cancelled")
    assert audit.verify().ok


# --- a file that verifies holds nothing its hashes do not cover ---------------------------------------------


def download(client: Client, fmt: str) -> str:
    root, _ = get_user_model().objects.get_or_create(username="root", is_superuser=True, is_staff=True)
    client.force_login(root)
    response = client.get(reverse("audit:export", args=[fmt]))
    assert response.status_code == 200
    return b"".join(response.streaming_content).decode("utf-8")  # type: ignore[attr-defined]


def verified(tmp_path: Path, name: str, text: str) -> audit_verify.Result:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return audit_verify.verify_file(path)


@pytest.fixture
def recorded() -> None:
    for n in range(3):
        audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"n": n, "message": "retrying"})


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"approved_by": "the CEO"}, "carries 'approved_by', which its hash does not cover"),
        ({"tool": False}, "tool is not of the type an export writes"),
        ({"outcome": []}, "outcome is not of the type an export writes"),
        ({"call_id": 0}, "call_id is not of the type an export writes"),
        ({"id": "as a float"}, "its id is not a whole number"),
    ],
    ids=["extra-field", "tool-false", "outcome-list", "call-zero", "id-float"],
)
def test_a_jsonl_line_showing_what_its_hash_does_not_cover_fails(
    client: Client, recorded: None, tmp_path: Path, change: dict, problem: str
) -> None:
    lines = download(client, "jsonl").splitlines()
    assert verified(tmp_path, "audit.jsonl", "\n".join(lines) + "\n").ok
    first = json.loads(lines[1])
    if "id" in change:  # 7.0 hashes as 7 does
        change = {"id": float(first["id"])}
    lines[1] = json.dumps({**first, **change})
    result = verified(tmp_path, "audit.jsonl", "\n".join(lines) + "\n")
    assert not result.ok
    assert result.line == 2
    assert problem in result.problem


def test_a_csv_row_with_a_cell_beyond_the_columns_fails(
    client: Client, recorded: None, tmp_path: Path
) -> None:
    text = download(client, "csv")
    assert verified(tmp_path, "audit.csv", text).ok
    rows = list(csv.reader(io.StringIO(text)))
    rows[2].append('=HYPERLINK("http://evil.example","approved")')
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    result = verified(tmp_path, "audit.csv", out.getvalue())
    assert not result.ok
    assert result.line == 3
    assert result.problem == "unreadable: the row has 17 cells; the header names 16"
    rows[2] = rows[2][:-2]
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    result = verified(tmp_path, "audit.csv", out.getvalue())
    assert not result.ok and "the row has 15 cells" in result.problem


def test_a_csv_id_spelled_otherwise_fails(client: Client, recorded: None, tmp_path: Path) -> None:
    rows = list(csv.reader(io.StringIO(download(client, "csv"))))
    digits = rows[2][0]
    full_width = "".join(chr(ord(digit) + 0xFEE0) for digit in digits)
    for spelling in [full_width, f"+{digits}", f" {digits}", f"0_{digits}"]:  # each reads as the id to int()
        rows[2][0] = spelling
        out = io.StringIO()
        csv.writer(out).writerows(rows)
        result = verified(tmp_path, "audit.csv", out.getvalue())
        assert not result.ok and "is not a whole number" in result.problem, spelling


# --- a secret in an address's query, fragment or a form body never reaches a row or an export ---------------


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (
            "opened https://api.example.com/v1/items?page=2&access_token=ya29.A0ARrdaM-s3cr3t&sort=asc",
            "opened https://api.example.com/v1/items?page=2&access_token=[redacted]&sort=asc",
        ),
        ("https://app.example.com/callback#state=x&id_token=eyJhbGciOi.e30.sig", None),
        ("password=hunter2&user=bob", "password=[redacted]&user=bob"),
        ("https://s3.example.com/b/k?X-Amz-Credential=AKIAEXAMPLE%2F20261207", None),
        ("https://h.example/?api%5Fkey=abc123", "https://h.example/?api%5Fkey=[redacted]"),
        ("search ?q=token&passed=3&pass_rate=0.5 if a==b", "search ?q=token&passed=3&pass_rate=0.5 if a==b"),
    ],
    ids=["query-token", "fragment-id-token", "form-body", "amz-credential", "encoded-name", "innocent"],
)
def test_a_secret_parameter_in_any_text_is_redacted_in_the_row_and_the_export(
    client: Client, text: str, kept: str | None
) -> None:
    event = audit.record(
        actor=Actor.system(), verb="call.retry_scheduled", data={"message": text, "args": [{"url": text}]}
    )
    stored = AuditEvent.objects.get(pk=event.pk).data
    assert stored["message"] == stored["args"][0]["url"]
    if kept is not None:
        assert stored["message"] == kept
    exported = download(client, "jsonl") + download(client, "csv")
    for secret in ["s3cr3t", "eyJhbGciOi", "hunter2", "AKIAEXAMPLE", "abc123"]:
        assert secret not in stored["message"]
        assert secret not in exported
    assert audit.verify().ok


# --- a forged prune record cannot write to the operator's terminal ------------------------------------------


def test_verify_audit_prints_a_forged_prune_record_as_a_terminal_cannot_obey(tmp_path: Path) -> None:
    first = audit.record(actor=Actor.system(), verb="call.submitted")
    head = audit.record(actor=Actor.system(), verb="call.cancelled")
    saved = tmp_path / "head.json"
    saved.write_text(json.dumps(audit.chain_head()), encoding="utf-8")
    # Whoever may write the table records a "prune" of the events up to the saved head, and removes them.
    forged = "\x1b]0;all clear\x07\x1b[2J\x1b[Hsaved head matches\naudit chain intact"
    audit.record(
        actor=Actor.system("retention\x1b[8m"),
        verb="audit.pruned",
        data={"first_id": first.id, "last_id": head.id, "last_hash": head.hash, "before": forged},
    )
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM approvals_auditevent WHERE id <= %s", [head.id])
    out = io.StringIO()
    call_command("verify_audit", head=saved, stdout=out)
    printed = out.getvalue()
    assert f"saved head #{head.id} was removed by a prune" in printed
    assert "\x1b" not in printed and "\x07" not in printed
    assert "\u27e8U+001B\u27e9]0;all clear" in printed
    # One line for the prune, one for the verdict: the record's newline forges no line of its own.
    assert len(printed.splitlines()) == 2


# --- a row recorded before a redaction rule existed shows no secret on the pages ---------------------------


def test_a_secret_in_a_row_recorded_before_its_rule_is_hidden_on_the_audit_pages(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = factories.call(factories.server("deploy"))
    secret = "ya29.A0ARrdaM-olderRelease"
    message = f"fetched https://api.example.com/items?access_token={secret}"
    with monkeypatch.context() as patched:  # as an earlier release recorded it
        patched.setattr(audit, "redact", lambda value: value)
        audit.record(actor=Actor.system(), verb="call.retry_scheduled", call=call, data={"message": message})
    assert AuditEvent.objects.get(call_id=call.pk).data["message"] == message
    root, _ = get_user_model().objects.get_or_create(username="root", is_superuser=True, is_staff=True)
    client.force_login(root)
    for url in [reverse("audit:index"), reverse("audit:newer") + "?after=0", f"/audit/calls/{call.pk}/"]:
        page = client.get(url).content.decode()
        assert "api.example.com/items?access_token=[redacted]" in page, url
        assert secret not in page, url
    assert audit.verify().ok  # the row itself is kept as recorded: its hash covers it
