"""Audit exports: of events that carry large data (a call's arguments may be up to ELICIT_MAX_BODY each) the
export holds about CHUNK_BYTES at a time, not CHUNK events whatever their size; and each person may export
only so often."""

from __future__ import annotations

import random
import string
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit import export as audit_export
from approvals.audit import verify as audit_verify
from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db

ROW = 300_000  # characters of arguments per event


@pytest.fixture
def big_events() -> int:
    rng = random.Random(7)
    text = "".join(rng.choice(string.ascii_letters) for _ in range(ROW))

    def content(n: int) -> str:
        # Text PostgreSQL stores as it is, and text it compresses to a few kilobytes.
        return text[n:] if n % 2 else f"{n} " * (ROW // 3)

    count = 70
    # Small events first: a chunk sized by the events before it would take all the large ones at once.
    for n in range(20):
        audit.record(actor=audit.Actor.system(), verb="server.tools_refreshed", data={"n": n})
    audit.append_many(
        [
            {
                "at": datetime.now(UTC),
                "actor_type": "agent",
                "actor_id": "1",
                "actor_label": "writer-bot",
                "verb": "call.submitted",
                "data": {"tool": "write_file", "arguments": {"path": f"/tmp/{n}", "content": content(n)}},
            }
            for n in range(count)
        ]
    )
    return count


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_export_of_large_events_holds_a_bounded_amount_at_a_time(
    client: Client, big_events: int, fmt: str
) -> None:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    response = client.get(reverse("audit:export", args=[fmt]))
    assert response.status_code == 200
    pieces = list(response.streaming_content)  # type: ignore[attr-defined]

    # Each piece is one chunk of events as read from the database: never far beyond the budget.
    assert max(len(piece) for piece in pieces) <= audit_export.CHUNK_BYTES + 2 * ROW
    body = b"".join(pieces)
    assert len(body) > 2 * audit_export.CHUNK_BYTES  # the test is about something: the whole is larger
    lines = body.decode().splitlines()
    if fmt == "jsonl":
        result = audit_verify.verify_jsonl(lines)
        assert result.ok and result.checked == 20 + big_events
    else:
        assert len(lines) == 1 + 20 + big_events


def test_small_events_still_come_in_chunks_of_many(client: Client) -> None:
    for n in range(30):
        audit.record(actor=audit.Actor.system(), verb="server.tools_refreshed", data={"n": n})
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    response = client.get(reverse("audit:export", args=["jsonl"]))
    pieces = list(response.streaming_content)  # type: ignore[attr-defined]
    # The header, a first chunk of a few events, the rest in one chunk, the trailer.
    assert len(pieces) <= 4
    assert audit_verify.verify_jsonl(b"".join(pieces).decode().splitlines()).checked == 30


def test_exports_are_limited_per_person_and_a_refused_one_records_nothing(
    client: Client, settings: Any
) -> None:
    """Each export is an audit event: without a limit anyone signed in (a viewer) could fill the log with
    ``audit.exported`` events by the thousand, and have the database read their whole view as often."""
    settings.ELICIT_AUDIT_EXPORT_RATE = "3/h"
    viewer = factories.user("viewer")
    other = factories.user("other-viewer")
    client.force_login(viewer)
    url = reverse("audit:export", args=["csv"])
    for _ in range(3):
        assert client.get(url).status_code == 200
    refused = client.get(url)
    assert refused.status_code == 429
    assert "Too many exports" in refused.content.decode()
    assert int(refused["Retry-After"]) > 0
    assert AuditEvent.objects.filter(verb="audit.exported").count() == 3
    client.force_login(other)  # counted per person
    assert client.get(url).status_code == 200
