"""Verify an audit export offline, without Django or a database; also the one home of the chain's hashing.

Usage::

    python -m approvals.audit.verify audit-export.jsonl     # or an audit-export.csv
    python approvals/audit/verify.py audit-export.jsonl    # the file alone also works, copied anywhere
    python -m approvals.audit.verify audit-export.jsonl --head audit-head-2026-12-01.json

It needs only the Python standard library. Exit status 0 means every line verifies, and the message says how
much that proves; 1 names the first line that does not; 2 means a file could not be read.

What is checked:

* every event line: ``hash == sha256(prev_hash + canonical(event))``, so a changed field fails; and it holds
  only what the hash covers, in the types an export writes (a field or a CSV cell beyond the columns, or
  ``"tool": false`` where the hash reads ``""``, fails: the file would show what its hashes do not vouch for);
* every export: ids rise, and an event whose id directly follows the one before it links to it (chain order
  is id order; ids can skip, as an append that is rolled back has used its ids, but never the chain);
* JSON Lines only: the trailer's ``count`` and ``digest`` (sha256 over the events' hashes, in file order),
  and no event newer than the header's ``through_id``: a line cut off or altered without its hash fails;
* exports the header marks ``"contiguous": true`` (an unfiltered export by a superuser): each event's
  ``prev_hash`` is the hash of the line before it, the first one's is the header's ``anchor``, and the last
  event is the header's ``through_id``: an event removed anywhere, a cut head or a cut tail fails, named.

A filtered export, or a CSV (which has no header saying what it covers), cannot prove that no event was
removed: a removed event looks like one the filter left out. Its result says so. Nor is anything in a file
beyond recomputing: the hashes and the trailer are plain SHA-256, so whoever removes an event can recompute
every hash after it. ``--head`` ties the file to a head kept outside the database (``manage.py
export_audit_head``): the event it names must be in the file with that hash, and the events linked up to it
are then the chain's own. The ``audit.exported`` event the header names can also be looked up in the chain.

``canonical`` and ``event_hash`` below are what ``approvals.audit`` uses to write and verify the chain, so
the offline check and the database can never disagree on the form.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
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


# Where a spreadsheet may split a cell the CSV writer leaves unquoted: ``;`` (the list separator of many
# locales) and a tab (checked by default in import dialogs). A comma always gets the cell quoted.
_CELL_SEPARATORS = re.compile(r"([;\t])")


def escape_cell(value: str) -> str:
    """`value` as a spreadsheet shows it as text: each part that could start a cell (the value's start, and
    what follows each ``;`` or tab) gets a leading apostrophe when it would run as a formula."""
    parts = _CELL_SEPARATORS.split(value)  # text, separator, text, ...
    for index in range(2, len(parts), 2):
        if parts[index].startswith(_FORMULA_START):
            parts[index] = "'" + parts[index]
    return ("'" if value.startswith(_FORMULA_START) else "") + "".join(parts)


def unescape_cell(value: str) -> str:
    """`escape_cell` undone: the exact value (the parts after a separator, then the value's start)."""
    parts = _CELL_SEPARATORS.split(value)
    for index in range(2, len(parts), 2):
        if parts[index].startswith("'") and parts[index][1:].startswith(_FORMULA_START):
            parts[index] = parts[index][1:]
    text = "".join(parts)
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA_START) else text


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
    complete: bool = False  # the file shows that no event of the range it covers is missing
    scope: str = ""  # what a clean result vouches for, and what it cannot

    @property
    def ok(self) -> bool:
        return self.line is None


# What an event line holds: the columns (``tool``, ``action`` and ``outcome`` may be absent: the hash leaves
# them out when empty) and, in JSON Lines, its ``type``. Each field the hash covers has one type: a value the
# hash reads the same in another type (``"tool": false`` for ``""``, ``"id": true`` for 1, ``"call_id": 0``
# for null) or a field the hash leaves out would let a file show what its hashes do not vouch for.
_OPTIONAL = frozenset({"tool", "action", "outcome"})
_EVENT_KEYS = frozenset({"type", *COLUMNS})
_TEXTS = ("at", "actor_type", "actor_id", "actor_label", "verb", "server", "team", "prev_hash", "hash")


def _check_shape(row: Mapping[str, Any]) -> None:
    """ValueError when an event line holds more, or other, than its hash covers (the line is then reported
    unreadable, as one that is not JSON)."""
    event = f"event #{str(row.get('id'))[:30]}"
    extra = sorted(str(key) for key in row if key not in _EVENT_KEYS)
    if extra:
        keys = ", ".join(repr(key[:40]) for key in extra[:3])
        raise ValueError(f"{event} carries {keys}, which its hash does not cover")
    missing = [key for key in COLUMNS if key not in row and key not in _OPTIONAL]
    if missing:
        raise ValueError(f"{event} has no {', '.join(missing)}")
    if not isinstance(row["id"], int) or isinstance(row["id"], bool) or row["id"] < 1:
        raise ValueError(f"{event}: its id is not a whole number")
    wrong = [key for key in _TEXTS if not isinstance(row[key], str)]
    wrong += [key for key in sorted(_OPTIONAL) if key in row and not isinstance(row[key], str)]
    wrong += [key for key in ("call_id", "input_request_id") if not isinstance(row[key], (str, type(None)))]
    wrong += [] if isinstance(row["data"], dict) else ["data"]
    if wrong:
        raise ValueError(f"{event}: {', '.join(wrong)} is not of the type an export writes")


class Span:
    """The events of a file, checked one by one as they are read, and what they show about the chain.

    An event must link to the one before it in the file when its id directly follows that one's (in any
    export), or always when the header gives an ``anchor`` (a contiguous export). Elsewhere an event that does
    not link is where the file passes over events of the chain: left out by a filter, or removed; which of
    the two, the file cannot tell.
    """

    def __init__(
        self, *, anchor: str | None = None, through: int | None = None, pin: int | None = None
    ) -> None:
        self.anchor = anchor  # contiguous exports: the hash the first event links to
        self.through = through  # JSON Lines: the newest id the header says the export covers
        self.pin = pin  # a saved head's id: that event's line, hash and linkage are kept for check_head()
        self.digest = Digest()
        self.first_id: int | None = None
        self.last_id: int | None = None
        self.last_hash = ""
        self.skips = 0  # places where an event does not link to the one before it in the file
        self.first_skip = (0, 0)
        self.pinned: tuple[int, str, bool] | None = None

    def add(self, number: int, row: Mapping[str, Any]) -> Result | None:
        """Check one event (line ``number``); the failure, if it fails."""
        _check_shape(row)
        event_id = row["id"]
        problem = self._order(event_id) or self._link(event_id, row["prev_hash"])
        if not problem and event_hash(row["prev_hash"], row) != row["hash"]:
            problem = f"event #{event_id} does not match its hash"
        if problem:
            return Result(self.digest.count, number, problem)
        if self.last_id is not None and row["prev_hash"] != self.last_hash:
            self.first_skip = (self.last_id, event_id) if not self.skips else self.first_skip
            self.skips += 1
        if event_id == self.pin:
            self.pinned = (number, row["hash"], self.skips == 0)
        if self.first_id is None:
            self.first_id = event_id
        self.last_id, self.last_hash = event_id, row["hash"]
        self.digest.add(row["hash"])
        return None

    def _order(self, event_id: int) -> str:
        if self.last_id is not None and event_id <= self.last_id:
            return f"event #{event_id} comes after #{self.last_id}: the events are out of order or repeated"
        if self.through is not None and event_id > self.through:
            return f"event #{event_id} is newer than the header's through_id (#{self.through})"
        return ""

    def _link(self, event_id: int, prev_hash: str) -> str:
        if self.last_id is None:
            if self.anchor is None or prev_hash == self.anchor:
                return ""
            return f"event #{event_id} does not link to the header's anchor: the events before it are missing"
        if prev_hash == self.last_hash or (self.anchor is None and event_id > self.last_id + 1):
            return ""
        if event_id == self.last_id + 1:
            return f"event #{event_id} does not link to event #{self.last_id} before it"
        return (
            f"event #{event_id} does not link to event #{self.last_id} before it: "
            f"the events between #{self.last_id} and #{event_id} are missing"
        )

    def tail(self) -> str:
        """A contiguous export ends at the header's ``through_id``; a problem if it does not."""
        if self.anchor is None or (self.last_id or 0) == self.through:
            return ""
        if self.last_id is None:
            return f"the file holds no events, but the header says the export runs through #{self.through}"
        return (
            f"the file ends at event #{self.last_id}, but the header says the export runs through "
            f"#{self.through}: the events after #{self.last_id} are missing"
        )

    def scope(self, reason: str, *, hint: bool = True) -> str:
        """What a clean file vouches for, in words; ``reason``: why a non-contiguous one cannot do more."""
        if self.anchor is not None and self.last_id is None:
            return "the chain held no events when it was exported"
        if self.anchor is not None:
            start = "the chain's start" if self.anchor == GENESIS else "the last pruned event"
            text = (
                f"every event from {start} through #{self.through} (the header's through_id), each linked to "
                "the one before it"
            )
            return text + (
                "; check it against a saved head (--head) to tie it to the live chain" if hint else ""
            )
        text = f"each event's own hash checks; this export cannot prove no event was removed ({reason})"
        if self.skips:
            before, after = self.first_skip
            text += (
                f"; it passes over events of the chain in {self.skips} place(s), the first between "
                f"#{before} and #{after}"
            )
        return text

    def finish(self, reason: str, head: Mapping[str, Any] | None, end_line: int) -> Result:
        result = Result(
            self.digest.count, complete=self.anchor is not None, scope=self.scope(reason, hint=head is None)
        )
        return result if head is None else check_head(result, self, head, end_line)


def check_head(result: Result, span: Span, head: Mapping[str, Any], end_line: int) -> Result:
    """Tie a verified file to a head kept outside the database (``manage.py export_audit_head``).

    Everything in the file can be recomputed; a head saved elsewhere cannot. The event it names must be in
    the file with its hash, and every event linked up to it is then the chain's own. A contiguous export
    that covers the head's id must hold it. A head newer than the export, or one a filter left out, vouches
    for nothing in the file.
    """
    head_id = head["head_id"]
    if head_id is None:
        note = "the saved head is of an empty chain: it vouches for nothing"
    elif span.pinned is not None:
        return _pinned_head(result, span.pinned, head)
    elif span.anchor is not None and (span.first_id or 0) < head_id <= (span.through or 0):
        problem = (
            f"the saved head #{head_id} is not in the file, though the export runs through "
            f"#{span.through}: it was removed"
        )
        return Result(result.checked, end_line, problem)
    else:
        note = f"the saved head #{head_id} is not among this file's events, so it vouches for none of them"
    return replace(result, scope=f"{result.scope}; {note}")


def _pinned_head(result: Result, pinned: tuple[int, str, bool], head: Mapping[str, Any]) -> Result:
    line, found, linked = pinned
    if found != head["head_hash"]:
        problem = (
            f"event #{head['head_id']} does not carry the saved head's hash: "
            "the events up to it were rewritten"
        )
        return Result(result.checked, line, problem)
    note = (
        "it and every event before it in the file are the chain's own"
        if linked
        else "the file passes over events before it, so only that event is tied to it"
    )
    return replace(result, scope=f"{result.scope}; the saved head #{head['head_id']} matches: {note}")


def verify_rows(rows: Iterable[tuple[int, Mapping[str, Any]]], span: Span) -> Result:
    """Check (line number, event) pairs in file order: the first failure, or how many verified."""
    for number, row in rows:
        failed = span.add(number, row)
        if failed is not None:
            return failed
    return Result(span.digest.count)


# What a malformed or hostile line raises while it is read and hashed (RecursionError: absurd nesting;
# OverflowError: an id of 1e999; csv.Error: a broken quote; UnicodeDecodeError, a ValueError: a file not in
# UTF-8): a failed line, named, never a traceback.
_UNREADABLE = (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError, csv.Error)
_NOT_CONTIGUOUS = "the header does not mark it contiguous: it is filtered, or holds only the exporter's teams"
_CSV = "a CSV export has no header saying what it covers; an unfiltered JSON Lines export does"


def verify_jsonl(lines: Iterable[str], *, head: Mapping[str, Any] | None = None) -> Result:
    numbered = enumerate(lines, start=1)
    state: dict[str, Any] = {"line": 1}

    def events() -> Iterator[tuple[int, dict[str, Any]]]:
        for number, text in numbered:
            state["line"] = number
            if not text.strip():
                continue
            item = json.loads(text)
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "event" and "trailer" not in state:
                yield number, item
            elif kind == "trailer" and "trailer" not in state:
                state["trailer"] = (number, item)
            else:
                raise ValueError(f"line {number}: unexpected {kind!r} line")

    try:
        span = _jsonl_span(next(numbered, (1, ""))[1], head)
        result = verify_rows(events(), span)
    except _UNREADABLE as exc:
        return Result(0, state["line"], f"unreadable: {exc}")
    if not result.ok:
        return result
    if "trailer" not in state:
        return Result(result.checked, state["line"], "the trailer line is missing: the file is cut short")
    number, tail = state["trailer"]
    if tail.get("count") != span.digest.count:
        problem = f"the trailer counts {tail.get('count')} events, the file has {span.digest.count}"
        return Result(result.checked, number, problem)
    if tail.get("digest") != span.digest.hexdigest():
        return Result(result.checked, number, "the trailer's digest does not match the events' hashes")
    if problem := span.tail():
        return Result(result.checked, number, problem)
    return span.finish(_NOT_CONTIGUOUS, head, number)


def _jsonl_span(text: str, head: Mapping[str, Any] | None) -> Span:
    """Read the header line: what the events after it must show."""
    item = json.loads(text) if text.strip() else None
    if not isinstance(item, dict) or item.get("type") != "header" or item.get("format") != FORMAT:
        raise ValueError(f"line 1 is not a {FORMAT} header")
    through = item.get("through_id")
    if not isinstance(through, int) or isinstance(through, bool):
        raise ValueError("the header gives no through_id")
    anchor = item.get("anchor") if item.get("contiguous") else None
    if item.get("contiguous") and not isinstance(anchor, str):
        raise ValueError("the header marks the export contiguous but gives no anchor")
    return Span(anchor=anchor, through=through, pin=None if head is None else head["head_id"])


def csv_row(values: Mapping[str | None, Any]) -> dict[str, Any]:
    """A CSV row as the event it exports (the types a JSON Lines line has); ValueError when a row has more or
    fewer cells than the header names (a cell beyond them is not covered by the hash)."""
    if None in values or any(values[key] is None for key in COLUMNS):
        cells = sum(values[key] is not None for key in COLUMNS) + len(values.get(None) or ())
        raise ValueError(f"the row has {cells} cells; the header names {len(COLUMNS)}")
    row: dict[str, Any] = {key: unescape_cell(values[key]) for key in COLUMNS}
    if not re.fullmatch(r"[0-9]{1,19}", row["id"]):
        raise ValueError(f"the id {row['id'][:30]!r} is not a whole number")
    row["id"] = int(row["id"])
    for key in ("call_id", "input_request_id"):
        row[key] = row[key] or None
    row["data"] = json.loads(row["data"])
    return row


# A cell may hold an event's whole data: far beyond the csv module's default limit of 128 KiB per field.
_CSV_FIELD_LIMIT = 2**31 - 1


def verify_csv(lines: Iterable[str], *, head: Mapping[str, Any] | None = None) -> Result:
    csv.field_size_limit(_CSV_FIELD_LIMIT)
    reader = csv.DictReader(_without_bom(lines))
    span = Span(pin=None if head is None else head["head_id"])
    try:
        if reader.fieldnames != COLUMNS:
            return Result(0, 1, "the header row does not name the export's columns")
        result = verify_rows(((reader.line_num, csv_row(values)) for values in reader), span)
    except _UNREADABLE as exc:
        return Result(span.digest.count, reader.line_num, f"unreadable: {exc}")
    if not result.ok:
        return result
    return span.finish(_CSV, head, reader.line_num)


def _without_bom(lines: Iterable[str]) -> Iterator[str]:
    """`lines` without the byte order mark a CSV export starts with (for Excel), however it was read."""
    iterator = iter(lines)
    first = next(iterator, None)
    if first is None:
        return
    yield first.removeprefix("\ufeff")
    yield from iterator


def verify_file(path: Path, *, head: Mapping[str, Any] | None = None) -> Result:
    with path.open(encoding="utf-8", newline="") as handle:
        if path.suffix.lower() == ".csv":
            return verify_csv(handle, head=head)
        return verify_jsonl(handle, head=head)


def read_head(path: Path) -> dict[str, Any]:
    """A head saved by ``manage.py export_audit_head``; ValueError when it is not one."""
    head = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} head")
    head_id, head_hash = head.get("head_id"), head.get("head_hash")
    if not (head_id is None or (isinstance(head_id, int) and not isinstance(head_id, bool))):
        raise ValueError("its head_id is not an event id")
    if not isinstance(head_hash, str):
        raise ValueError("it has no head_hash")
    return head


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m approvals.audit.verify", description="Verify an audit export offline."
    )
    parser.add_argument("export", type=Path, help="an export: EXPORT.jsonl or EXPORT.csv")
    parser.add_argument(
        "--head", type=Path, help="a head saved by manage.py export_audit_head, kept elsewhere"
    )
    args = parser.parse_args(argv)
    path: Path = args.export
    try:
        head = None if args.head is None else read_head(args.head)
    except (OSError, ValueError) as exc:
        print(f"cannot read the saved head {args.head}: {exc}", file=sys.stderr)
        return 2
    try:
        result = verify_file(path, head=head)
    except OSError as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 2
    if result.ok:
        print(f"{path}: {result.checked} events verified: {result.scope}")
        return 0
    print(f"{path}: line {result.line}: {result.problem} ({result.checked} events before it verified)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
