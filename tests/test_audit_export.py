"""Exports: streamed CSV and JSON Lines with the chain hashes, verifiable offline; each export is audited."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import AsyncClient, Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit import export as audit_export
from approvals.audit import verify as audit_verify
from approvals.audit.core import Actor
from approvals.models import AuditEvent, ToolCall
from tests import factories

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def events() -> list[AuditEvent]:
    release = factories.team("release")
    deploy = factories.server("deploy", default_team=release)
    other = factories.server("other")
    call = factories.call(deploy)
    made = []
    for n in range(7):
        made.append(
            audit.record(
                actor=Actor.system(),
                verb="call.retry_scheduled",
                call=call if n % 2 == 0 else factories.call(other),
                data={"n": n, "message": '=HYPERLINK("http://evil.example","click")', "note": "Grüße, سلام"},
            )
        )
    return made


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


def download(client: Client, fmt: str, params: dict[str, str] | None = None) -> bytes:
    response = client.get(reverse("audit:export", args=[fmt]), params or {})
    assert response.status_code == 200
    assert response.streaming
    return b"".join(response.streaming_content)


def verify_offline(tmp_path: Path, name: str, content: bytes) -> subprocess.CompletedProcess[str]:
    """The documented command, run as an auditor would: a plain Python, no Django settings."""
    path = tmp_path / name
    path.write_bytes(content)
    return subprocess.run(
        [sys.executable, "-m", "approvals.audit.verify", str(path)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_filtered_jsonl_export_verifies_offline(root: Client, events, tmp_path: Path) -> None:
    body = download(root, "jsonl", {"team": "release"})
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["filters"] == {"team": "release"}
    assert not lines[0]["contiguous"]
    assert [line["id"] for line in lines[1:-1]] == [e.id for e in events if e.team_slug == "release"]
    assert lines[-1] == {"type": "trailer", "count": 4, "digest": lines[-1]["digest"]}
    result = verify_offline(tmp_path, "export.jsonl", body)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 events verified" in result.stdout


@pytest.mark.parametrize(
    ("alter", "problem"),
    [
        (lambda line: line.replace('"n":2', '"n":3'), "does not match its hash"),
        (
            lambda line: line.replace('"actor_label":"hub"', '"actor_label":"mallory"'),
            "does not match its hash",
        ),
        (lambda line: "", "the trailer counts 4 events, the file has 3"),
    ],
    ids=["changed data", "changed actor", "removed line"],
)
def test_an_altered_jsonl_line_fails(root: Client, events, tmp_path: Path, alter, problem: str) -> None:
    lines = download(root, "jsonl", {"team": "release"}).decode().splitlines(keepends=True)
    target = next(i for i, line in enumerate(lines) if '"n":2' in line)
    lines[target] = alter(lines[target])
    result = verify_offline(tmp_path, "export.jsonl", "".join(lines).encode())
    assert result.returncode == 1
    assert problem in result.stdout


def test_a_line_altered_with_a_recomputed_hash_still_fails_on_the_digest(root: Client, events) -> None:
    lines = download(root, "jsonl", {"team": "release"}).decode().splitlines()
    row = json.loads(lines[2])
    row["data"]["n"] = 99
    row["hash"] = audit_verify.event_hash(row["prev_hash"], row)
    lines[2] = json.dumps(row)
    result = audit_verify.verify_jsonl(lines)
    assert not result.ok and "digest" in result.problem


def test_an_unfiltered_export_checks_every_link(root: Client, events, tmp_path: Path) -> None:
    lines = download(root, "jsonl").decode().splitlines()
    header = json.loads(lines[0])
    assert header["contiguous"] and header["anchor"] == audit_verify.GENESIS
    assert audit_verify.verify_jsonl(lines).ok
    del lines[3]  # drop one event and fix the trailer: only the links can tell
    rows = [json.loads(line) for line in lines[1:-1]]
    digest = audit_verify.Digest()
    for row in rows:
        digest.add(row["hash"])
    lines[-1] = json.dumps({"type": "trailer", "count": digest.count, "digest": digest.hexdigest()})
    result = audit_verify.verify_jsonl(lines)
    assert not result.ok and "does not link" in result.problem


def test_csv_export_is_safe_in_a_spreadsheet_and_verifies(root: Client, events, tmp_path: Path) -> None:
    call = AuditEvent.objects.filter(server_slug="deploy").values_list("call_id", flat=True).first()
    evil = Actor("user", "9", "=cmd|' /C calc'!A0")
    audit.record(actor=evil, verb="input.answered", call=ToolCall.objects.get(pk=call), data={})
    body = download(root, "csv", {"server": "deploy"})
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert len(rows) == 5
    assert all(not row[column].startswith(("=", "+", "-", "@")) for row in rows for column in row)
    assert rows[-1]["actor_label"] == "'=cmd|' /C calc'!A0"
    assert rows[0]["data"].startswith("{")  # the formula in the data sits inside the JSON, quoted
    result = verify_offline(tmp_path, "export.csv", body)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 events verified" in result.stdout


def test_csv_cells_that_look_like_formulas_are_escaped_and_restored() -> None:
    values = ["=1+1", "+33 1 23", "-5", "@SUM(A1)", "'quoted", "'=x", "plain", "x;=HYPERLINK(1)", "a;;'-b;"]
    for value in values:
        escaped = audit_verify.escape_cell(value)
        # Read with either list separator, no cell starts a formula.
        assert not any(part.startswith(("=", "+", "-", "@")) for part in escaped.split(";")), escaped
        assert audit_verify.unescape_cell(escaped) == value


def test_a_formula_after_a_semicolon_stays_text_where_the_list_separator_is_a_semicolon(
    root: Client, tmp_path: Path
) -> None:
    audit.record(
        actor=Actor("user", "9", 'x;=HYPERLINK("https://evil.example")'), verb="input.answered", data={}
    )
    body = download(root, "csv", {})
    for line in body.decode().splitlines():
        for cell in next(csv.reader([line], delimiter=";")):
            assert not cell.lstrip('"').startswith(("=", "+", "-", "@")), cell
    result = verify_offline(tmp_path, "export.csv", body)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_export_is_an_audit_event_and_covers_what_came_before(root: Client, events) -> None:
    lines = download(root, "jsonl", {"verb": "call.retry_scheduled"}).decode().splitlines()
    exported = AuditEvent.objects.get(verb="audit.exported")
    assert exported.actor_label == "root"
    assert exported.data == {
        "format": "jsonl",
        "filters": {"verb": "call.retry_scheduled"},
        "through_id": events[-1].id,
        "contiguous": False,
    }
    assert json.loads(lines[0])["export_event"] == {"id": exported.id, "hash": exported.hash}
    assert audit.verify().ok


def test_exports_only_hold_what_the_user_may_see(client: Client, events) -> None:
    viewer = factories.user("vera")
    factories.team("release", (viewer, "viewer"))
    client.force_login(viewer)
    lines = download(client, "jsonl").decode().splitlines()
    ids = [json.loads(line)["id"] for line in lines[1:-1]]
    assert ids == [e.id for e in events if e.team_slug == "release"]
    assert json.loads(lines[0])["contiguous"] is False


def test_bad_filters_are_refused_before_anything_is_recorded(root: Client, events) -> None:
    response = root.get(reverse("audit:export", args=["csv"]), {"since": "soon"})
    assert response.status_code == 400
    assert "Enter a valid date/time." in response.content.decode()
    assert not AuditEvent.objects.filter(verb="audit.exported").exists()


def test_the_export_reads_in_chunks(monkeypatch, events) -> None:
    monkeypatch.setattr(audit_export, "CHUNK", 2)
    _, header = audit_export.export_start(actor=Actor.system(), fmt="jsonl", filters={}, contiguous=True)
    pieces = list(audit_export.jsonl_lines(AuditEvent.objects.all(), header))
    assert len(pieces) == 1 + 4 + 1  # header, 7 events in chunks of 2, trailer
    assert audit_verify.verify_jsonl(b"".join(pieces).decode().splitlines()).ok


def test_under_asgi_the_export_streams_from_an_async_iterator(events) -> None:
    from asgiref.sync import async_to_sync

    async def fetch() -> tuple[bool, bytes]:
        client = AsyncClient()
        await client.aforce_login(await _superuser())
        response = await client.get(reverse("audit:export", args=["jsonl"]))
        assert response.is_async
        return response.is_async, b"".join([chunk async for chunk in response.streaming_content])

    is_async, body = async_to_sync(fetch)()
    assert is_async and audit_verify.verify_jsonl(body.decode().splitlines()).ok


async def _superuser():
    from asgiref.sync import sync_to_async

    return await sync_to_async(factories.user)("async-root", is_superuser=True)


# --- completeness: what a clean result proves, and what it cannot ----------------------------------------


def reseal(lines: list[str], *, rechain: bool = False) -> list[str]:
    """Recompute the trailer of a doctored JSON Lines export (plain SHA-256: anyone can), and with
    ``rechain`` every hash and link after the header's anchor too, as a careful forger would."""
    rows = [json.loads(line) for line in lines[1:-1]]
    previous = json.loads(lines[0])["anchor"]
    digest = audit_verify.Digest()
    for row in rows:
        if rechain:
            row["prev_hash"] = previous
            row["hash"] = previous = audit_verify.event_hash(previous, row)
        digest.add(row["hash"])
    trailer = {"type": "trailer", "count": digest.count, "digest": digest.hexdigest()}
    return [lines[0], *map(json.dumps, rows), json.dumps(trailer)]


def with_header(lines: list[str], **changes: object) -> list[str]:
    return [json.dumps({**json.loads(lines[0]), **changes}), *lines[1:]]


def saved_head(tmp_path: Path) -> Path:
    out = io.StringIO()
    call_command("export_audit_head", stdout=out)
    path = tmp_path / "head.json"
    path.write_text(out.getvalue())
    return path


def test_an_untouched_contiguous_export_proves_it_is_complete(root: Client, events, tmp_path: Path) -> None:
    # An append rolled back has used its id: the chain's ids skip it, and its links do not.
    with contextlib.suppress(RuntimeError), transaction.atomic():
        audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"n": "rolled back"})
        raise RuntimeError
    audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"n": 7})
    body = download(root, "jsonl")
    header, *rows = [json.loads(line) for line in body.decode().splitlines()[:-1]]
    assert rows[-1]["id"] == rows[-2]["id"] + 2 and rows[-1]["id"] == header["through_id"]
    result = verify_offline(tmp_path, "export.jsonl", body)
    assert result.returncode == 0, result.stdout
    complete = f"{len(rows)} events verified: every event from the chain's start through #{rows[-1]['id']}"
    assert complete in result.stdout
    assert "cannot prove" not in result.stdout
    assert audit_verify.verify_jsonl(body.decode().splitlines()).complete


@pytest.mark.parametrize(
    ("doctor", "problem"),
    [
        (
            lambda lines: reseal(lines[:3] + lines[4:]),
            lambda ids: f"the events between #{ids[1]} and #{ids[3]} are missing",
        ),
        (
            lambda lines: reseal(lines[:-3] + lines[-1:]),
            lambda ids: f"runs through #{ids[-1]}: the events after #{ids[-3]} are missing",
        ),
        (
            lambda lines: reseal(lines[:1] + lines[2:]),
            lambda ids: (
                f"event #{ids[1]} does not link to the header's anchor: the events before it are missing"
            ),
        ),
        (
            lambda lines: with_header(lines, through_id=json.loads(lines[0])["through_id"] + 5),
            lambda ids: f"the file ends at event #{ids[-1]}, but the header says the export runs through",
        ),
        (
            lambda lines: with_header(lines, through_id=json.loads(lines[0])["through_id"] - 1),
            lambda ids: f"event #{ids[-1]} is newer than the header's through_id",
        ),
    ],
    ids=[
        "middle event removed",
        "tail cut",
        "first event removed",
        "through_id raised",
        "through_id lowered",
    ],
)
def test_a_contiguous_export_missing_events_fails_naming_them(
    root: Client, events, tmp_path: Path, doctor, problem
) -> None:
    lines = download(root, "jsonl").decode().splitlines()
    ids = [json.loads(line)["id"] for line in lines[1:-1]]
    result = verify_offline(tmp_path, "export.jsonl", "\n".join(doctor(lines)).encode())
    assert result.returncode == 1, result.stdout
    assert problem(ids) in result.stdout


def test_a_filtered_export_verifies_its_events_but_not_its_completeness(
    root: Client, events, tmp_path: Path
) -> None:
    lines = download(root, "jsonl", {"team": "release"}).decode().splitlines()
    untouched = verify_offline(tmp_path, "export.jsonl", "\n".join(lines).encode())
    assert untouched.returncode == 0
    assert (
        "4 events verified: each event's own hash checks; this export cannot prove no event was removed"
        in untouched.stdout
    )
    removed = verify_offline(tmp_path, "doctored.jsonl", "\n".join(reseal(lines[:2] + lines[3:])).encode())
    assert removed.returncode == 0  # a removed event looks like one the filter left out: no more is claimed
    assert (
        "3 events verified: each event's own hash checks; this export cannot prove no event was removed"
        in removed.stdout
    )
    assert not audit_verify.verify_jsonl(lines).complete


def test_a_csv_export_with_rows_removed_says_where_it_skips(root: Client, events, tmp_path: Path) -> None:
    lines = download(root, "csv").decode("utf-8-sig").splitlines(keepends=True)
    ids = [int(row["id"]) for row in csv.DictReader(lines)]
    result = verify_offline(tmp_path, "export.csv", "".join(lines[:2] + lines[4:]).encode())
    assert result.returncode == 0
    skipped = f"passes over events of the chain in 1 place(s), the first between #{ids[0]} and #{ids[3]}"
    assert (
        f"{len(ids) - 2} events verified: each event's own hash checks; this export cannot prove"
        in result.stdout
    )
    assert skipped in result.stdout


def test_a_saved_head_ties_an_export_to_the_chain(root: Client, events, tmp_path: Path) -> None:
    head = saved_head(tmp_path)
    audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"n": 7})
    lines = download(root, "jsonl").decode().splitlines()
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(lines))
    assert audit_verify.main([str(path), "--head", str(head)]) == 0
    scope = audit_verify.verify_file(path, head=audit_verify.read_head(head)).scope
    assert scope.endswith(
        f"the saved head #{events[-1].id} matches: it and every event before it in the file "
        "are the chain's own"
    )


@pytest.mark.parametrize(
    ("drop", "problem"),
    [(3, "does not carry the saved head's hash"), (-3, "is not in the file, though the export runs through")],
    ids=["an event before the head", "the head's own event"],
)
def test_a_saved_head_catches_a_recomputed_chain(
    root: Client, events, tmp_path: Path, drop: int, problem: str, capsys
) -> None:
    head = saved_head(tmp_path)
    audit.record(actor=Actor.system(), verb="call.retry_scheduled", data={"n": 7})
    lines = download(root, "jsonl").decode().splitlines()
    del lines[drop]
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(reseal(lines, rechain=True)))
    assert audit_verify.verify_file(path).ok  # consistent in itself: only something kept elsewhere can tell
    assert audit_verify.main([str(path), "--head", str(head)]) == 1
    assert problem in capsys.readouterr().out
