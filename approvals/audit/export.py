"""Streamed exports of the audit log as CSV or JSON Lines, with the chain hashes, in constant memory.

Rows are read in keyset chunks (``id > last`` in id order) and written as they come, so a million events
take no more memory than one chunk. Under ASGI the response gets an async iterator that fetches each chunk in
a worker thread (a sync iterator would be buffered whole by Django). Every export is itself an audit event
(``audit.exported``), recorded before the first byte, and covers the events up to the one before it.
Verify a JSON Lines export offline with ``python -m approvals.audit.verify FILE.jsonl``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, StreamingHttpResponse
from django.utils import timezone

from approvals.audit import core as audit
from approvals.audit.verify import COLUMNS, FORMAT, Digest, escape_cell
from approvals.models import AuditEvent

CHUNK = 2000  # events a chunk holds at most
CHUNK_BYTES = 8 * 1024 * 1024  # and about this much event data (one larger event is a chunk alone)
FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
EXPORTED = "audit.exported"


def export_start(
    *, actor: audit.Actor, fmt: str, filters: Mapping[str, Any], contiguous: bool
) -> tuple[AuditEvent, dict[str, Any]]:
    """Record the export and return it with the header describing what the file holds."""
    anchor, _ = audit.chain_anchor()
    through = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    event = audit.record(
        actor=actor,
        verb=EXPORTED,
        data={"format": fmt, "filters": dict(filters), "through_id": through, "contiguous": contiguous},
    )
    header = {
        "type": "header",
        "format": FORMAT,
        "exported_at": event.at.isoformat(),
        "exported_by": actor.label,
        "filters": dict(filters),
        "through_id": through,
        "contiguous": contiguous,
        "anchor": anchor if contiguous else None,
        "export_event": {"id": event.id, "hash": event.hash},
    }
    return event, header


def chunks(qs: QuerySet[AuditEvent], through_id: int) -> Iterator[list[dict[str, Any]]]:
    """The events up to ``through_id`` in id order, a chunk at a time (``audit.in_chunks``): at most CHUNK
    events and about CHUNK_BYTES of data (an event's data may be as large as a call's arguments, up to
    ELICIT_MAX_BODY each)."""
    for rows in audit.in_chunks(qs, through_id=through_id, rows=CHUNK, budget=CHUNK_BYTES):
        yield [audit.export_row(row) for row in rows]


def jsonl_lines(qs: QuerySet[AuditEvent], header: dict[str, Any]) -> Iterator[bytes]:
    digest = Digest()
    yield _json_line(header)
    for rows in chunks(qs, header["through_id"]):
        out = []
        for row in rows:
            digest.add(row["hash"])
            out.append(_json_line({"type": "event", **row}))
        yield b"".join(out)
    yield _json_line({"type": "trailer", "count": digest.count, "digest": digest.hexdigest()})


# Excel reads a CSV file without a byte order mark in the system's legacy code page, so "Grüße" would show as
# "GrÃ¼ÃŸe": the mark makes it read UTF-8. The offline verifier and Python's "utf-8-sig" skip it.
BOM = "\ufeff"


def csv_lines(qs: QuerySet[AuditEvent], header: dict[str, Any]) -> Iterator[bytes]:
    buffer = io.StringIO()
    buffer.write(BOM)
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for rows in chunks(qs, header["through_id"]):
        for row in rows:
            writer.writerow([_cell(row[column]) for column in COLUMNS])
        yield buffer.getvalue().encode()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue().encode()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # A value like "=HYPERLINK(...)" must reach a spreadsheet as text, never as a formula.
    return escape_cell(str(value))


def _json_line(item: Mapping[str, Any]) -> bytes:
    return json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _next_chunk(lines: Iterator[bytes]) -> bytes | None:
    return next(lines, None)


async def _in_threads(lines: Iterator[bytes]) -> AsyncIterator[bytes]:
    step = sync_to_async(_next_chunk, thread_sensitive=True)
    while (chunk := await step(lines)) is not None:
        yield chunk


def export_response(
    request: HttpRequest, *, qs: QuerySet[AuditEvent], fmt: str, filters: Mapping[str, Any], contiguous: bool
) -> StreamingHttpResponse:
    if fmt not in FORMATS:
        raise Http404("Unknown export format.")
    _, header = export_start(
        actor=audit.Actor.user(request.user), fmt=fmt, filters=filters, contiguous=contiguous
    )
    lines = jsonl_lines(qs, header) if fmt == "jsonl" else csv_lines(qs, header)
    content = _in_threads(lines) if isinstance(request, ASGIRequest) else lines
    response = StreamingHttpResponse(content, content_type=FORMATS[fmt])
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{fmt}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
