"""Verify an audit export offline, without Django or a database; also the one home of the chain's hashing.

Usage::

    python -m approvals.audit.verify audit-export.jsonl     # or an audit-export.csv
    python approvals/audit/verify.py audit-export.jsonl    # the file alone also works, copied anywhere

It needs only the Python standard library. Exit status 0 means every line verifies; 1 names the first line
that does not; 2 means the file could not be read.

What is checked:

* every event line: ``hash == sha256(prev_hash + canonical(event))``, so a changed field fails;
* JSON Lines only: the trailer's ``count`` and ``digest`` (sha256 over the events' hashes, in file order),
  so a line removed, added, or altered together with its hash fails too;
* exports the header marks ``"contiguous": true`` (an unfiltered export by a superuser): each event's
  ``prev_hash`` is the hash of the line before it, and the first one's is the header's ``anchor``.

To tie an export to the live chain, compare its last hash with the chain head kept outside the database
(``manage.py export_audit_head``) or look up the ``audit.exported`` event named in the header.

``canonical`` and ``event_hash`` below are what ``approvals.audit`` uses to write and verify the chain, so
the offline check and the database can never disagree on the form.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
FORMAT = "elicit-hub-audit/1"
# Columns of a CSV export, in order; JSON Lines events carry the same keys.
COLUMNS = [
    "id",
    "at",
    "actor_type",
    "actor_id",
    "actor_label",
    "verb",
    "call_id",
    "input_request_id",
    "server",
    "team",
    "tool",
    "action",
    "outcome",
    "data",
    "prev_hash",
    "hash",
]
# Cells a spreadsheet would run as a formula get a leading apostrophe; one already starting with an
# apostrophe gets another, so unescape_cell() restores every value exactly.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")


def canonical(row: Mapping[str, Any]) -> bytes:
    """The bytes a row's hash covers: sorted-keys compact JSON.

    ``tool``, ``action`` and ``outcome`` joined the form with the audit history (migration 0003); they are
    left out when empty, so rows written before them keep their hashes.
    """
    body: dict[str, Any] = {
        "id": int(row["id"]),
        "at": row["at"],
        "actor": [row["actor_type"], row["actor_id"], row["actor_label"]],
        "verb": row["verb"],
        "call": row["call_id"] or None,
        "input_request": row["input_request_id"] or None,
        "server": row["server"],
        "team": row["team"],
        "data": row["data"],
    }
    for key in ("tool", "action", "outcome"):
        if row.get(key):
            body[key] = row[key]
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def event_hash(prev_hash: str, row: Mapping[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(row)).hexdigest()


def derive_action_outcome(verb: str, data: Mapping[str, Any]) -> tuple[str, str]:
    """The reviewer's action and the outcome an event records, as filterable columns."""
    action = str(data.get("action") or "") if verb == "input.answered" else ""
    noun, _, what = verb.partition(".")
    if verb == "round.answered":
        outcome = str(data.get("outcome") or "")
    elif noun in {"call", "input", "relay"} and what in {"completed", "failed", "expired", "cancelled"}:
        outcome = what
    elif verb in {"input.answered", "relay.answered"}:
        outcome = "answered"
    elif verb == "input.unsupported":
        outcome = "unsupported"
    elif verb == "call.outcome_discarded":
        outcome = "discarded"
    else:
        outcome = ""
    return action, outcome


def escape_cell(value: str) -> str:
    return "'" + value if value.startswith(_FORMULA_START) else value


def unescape_cell(value: str) -> str:
    return value[1:] if value.startswith("'") and value[1:].startswith(_FORMULA_START) else value


class Digest:
    """sha256 over the events' hashes in export order: the trailer's ``digest``."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.count = 0

    def add(self, row_hash: str) -> None:
        self._sha.update(row_hash.encode() + b"\n")
        self.count += 1

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


@dataclass(frozen=True)
class Result:
    checked: int
    line: int | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.line is None


def verify_rows(
    rows: Iterable[tuple[int, Mapping[str, Any]]], *, anchor: str | None = None
) -> tuple[Result, Digest]:
    """Check (line number, event) pairs; with an ``anchor``, also that each links to the one before."""
    digest = Digest()
    previous = anchor
    for number, row in rows:
        if previous is not None and row["prev_hash"] != previous:
            return Result(
                digest.count, number, f"event #{row['id']} does not link to the event before it"
            ), digest
        if event_hash(row["prev_hash"], row) != row["hash"]:
            return Result(digest.count, number, f"event #{row['id']} does not match its hash"), digest
        digest.add(row["hash"])
        if anchor is not None:
            previous = row["hash"]
    return Result(digest.count), digest


def verify_jsonl(lines: Iterable[str]) -> Result:
    state: dict[str, Any] = {}

    def events() -> Iterator[tuple[int, dict[str, Any]]]:
        for number, text in enumerate(lines, start=1):
            state["line"] = number
            if not text.strip():
                continue
            item = json.loads(text)
            kind = item.get("type") if isinstance(item, dict) else None
            if number == 1:
                if kind != "header" or item.get("format") != FORMAT:
                    raise ValueError(f"line 1 is not a {FORMAT} header")
                state["anchor"] = item.get("anchor") if item.get("contiguous") else None
            elif kind == "event" and "trailer" not in state:
                yield number, item
            elif kind == "trailer" and "trailer" not in state:
                state["trailer"] = (number, item)
            else:
                raise ValueError(f"line {number}: unexpected {kind!r} line")

    rows = events()
    try:
        first = next(rows, None)  # reads the header, which decides whether links are checked
        result, digest = verify_rows(_prepend(first, rows), anchor=state.get("anchor"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return Result(0, state.get("line", 1), f"unreadable: {exc}")
    if not result.ok:
        return result
    if "trailer" not in state:
        return Result(
            result.checked, state.get("line", 1), "the trailer line is missing: the file is cut short"
        )
    number, tail = state["trailer"]
    if tail.get("count") != digest.count:
        problem = f"the trailer counts {tail.get('count')} events, the file has {digest.count}"
        return Result(result.checked, number, problem)
    if tail.get("digest") != digest.hexdigest():
        return Result(result.checked, number, "the trailer's digest does not match the events' hashes")
    return result


def _prepend(
    first: tuple[int, dict[str, Any]] | None, rest: Iterator[tuple[int, dict[str, Any]]]
) -> Iterator[tuple[int, dict[str, Any]]]:
    if first is not None:
        yield first
    yield from rest


def csv_row(values: Mapping[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {key: unescape_cell(values[key]) for key in COLUMNS}
    row["data"] = json.loads(row["data"])
    return row


def verify_csv(lines: Iterable[str]) -> Result:
    reader = csv.DictReader(lines)
    if reader.fieldnames != COLUMNS:
        return Result(0, 1, "the header row does not name the export's columns")
    try:
        result, _ = verify_rows((reader.line_num, csv_row(values)) for values in reader)
    except (ValueError, KeyError) as exc:
        return Result(0, reader.line_num, f"unreadable: {exc}")
    return result


def verify_file(path: Path) -> Result:
    with path.open(encoding="utf-8", newline="") as handle:
        if path.suffix.lower() == ".csv":
            return verify_csv(handle)
        return verify_jsonl(handle)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m approvals.audit.verify EXPORT.jsonl|EXPORT.csv", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        result = verify_file(path)
    except OSError as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 2
    if result.ok:
        print(f"{path}: {result.checked} events verified")
        return 0
    print(f"{path}: line {result.line}: {result.problem} ({result.checked} events before it verified)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
