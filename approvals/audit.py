"""The audit log: the one place that writes AuditEvent rows.

Every row carries ``hash = sha256(prev_hash + canonical(row))``. Appends take a transaction-scoped advisory
lock, so the chain order is the id order even with many writers, and the lock is held only until the
surrounding transaction commits. Secrets are redacted before anything is recorded.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from approvals.models import AgentClient, AuditEvent, InputRequest, ToolCall

GENESIS = "0" * 64
_CHAIN_LOCK = 0x6175646974  # "audit": any constant shared by every writer
REDACTED = "[redacted]"
_SECRET_KEY = re.compile(
    r"(request_?state|password|passwd|secret|token|api_?key|authorization|cookie|credential|headers|card_?number|cvv)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Actor:
    type: str
    id: str = ""
    label: str = ""

    @classmethod
    def user(cls, user: Any) -> Actor:
        return cls(AuditEvent.ActorType.USER, str(user.pk), user.get_username())

    @classmethod
    def agent(cls, agent: AgentClient) -> Actor:
        return cls(AuditEvent.ActorType.AGENT, str(agent.pk), agent.name)

    @classmethod
    def system(cls, label: str = "hub") -> Actor:
        return cls(AuditEvent.ActorType.SYSTEM, "", label)


def redact(value: Any) -> Any:
    """Drop the values of secret-looking keys, at any depth."""
    if isinstance(value, Mapping):
        return {
            key: (REDACTED if _SECRET_KEY.search(str(key)) else redact(item)) for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


def record(
    *,
    actor: Actor,
    verb: str,
    call: ToolCall | None = None,
    input_request: InputRequest | None = None,
    data: Mapping[str, Any] | None = None,
    team_slug: str = "",
) -> AuditEvent:
    """Append one event to the chain. Runs inside the caller's transaction (or its own)."""
    if "." not in verb:
        raise ValueError(f"audit verbs are namespaced (noun.verb), got {verb!r}")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CHAIN_LOCK])
            cursor.execute("SELECT nextval(pg_get_serial_sequence('approvals_auditevent', 'id'))")
            (next_id,) = cursor.fetchone()
        last = AuditEvent.objects.order_by("-id").values_list("hash", flat=True).first()
        event = AuditEvent(
            id=next_id,
            at=timezone.now(),
            actor_type=actor.type,
            actor_id=actor.id,
            actor_label=actor.label,
            verb=verb,
            call_id=call.pk if call else (input_request.round.call_id if input_request else None),
            input_request_id=input_request.pk if input_request else None,
            server_slug=call.server_slug if call else "",
            team_slug=team_slug or (input_request.team.slug if input_request and input_request.team else ""),
            data=redact(dict(data or {})),
            prev_hash=last or GENESIS,
        )
        event.hash = compute_hash(event)
        event.save(force_insert=True)
    return event


def canonical(event: AuditEvent) -> bytes:
    at = event.at.isoformat() if isinstance(event.at, datetime) else str(event.at)
    body = {
        "id": event.id,
        "at": at,
        "actor": [event.actor_type, event.actor_id, event.actor_label],
        "verb": event.verb,
        "call": str(event.call_id) if event.call_id else None,
        "input_request": str(event.input_request_id) if event.input_request_id else None,
        "server": event.server_slug,
        "team": event.team_slug,
        "data": event.data,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def compute_hash(event: AuditEvent) -> str:
    return hashlib.sha256(event.prev_hash.encode() + canonical(event)).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    checked: int
    first_bad_id: int | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.first_bad_id is None


def verify(events: Iterator[AuditEvent] | None = None) -> ChainReport:
    """Walk the chain in id order; name the first row whose hash or link does not match."""
    rows = events if events is not None else AuditEvent.objects.order_by("id").iterator(chunk_size=2000)
    previous = GENESIS
    checked = 0
    for event in rows:
        if event.prev_hash != previous:
            return ChainReport(checked, event.id, "its prev_hash does not match the row before it")
        if compute_hash(event) != event.hash:
            return ChainReport(checked, event.id, "its contents do not match its hash")
        previous = event.hash
        checked += 1
    return ChainReport(checked)
