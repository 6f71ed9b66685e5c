"""Sending a call to its MCP server: the first tools/call, then one retry per answered round.

Exactly once: a send is claimed with a conditional UPDATE and performed while holding a PostgreSQL session
advisory lock on the call. A second task for the same call (a duplicate message, a beat recovery) cannot
take the lock while the first is sending, and finds nothing to claim once it has finished. If a worker dies
mid-send, its connection closes and the lock goes with it; the redelivered task then finds the send still
claimed (``running`` / ``sending``), cannot know whether the server saw it, and re-sends it with the same
``Idempotency-Key`` so a server that honours the header answers without running the tool again.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from approvals import mcp_client
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import Round, ToolCall, send_idempotency_key
from approvals.services import holding
from approvals.services.calls import call_finish
from approvals.services.rounds import input_responses, round_open
from approvals.services.servers import server_after_send, server_config

logger = logging.getLogger(__name__)
SYSTEM = Actor.system()
MAX_ROUNDS = 50


def _lock_key(call_id: Any) -> int:
    return int.from_bytes(hashlib.sha256(f"send:{call_id}".encode()).digest()[:8], "big", signed=True)


@contextmanager
def send_lock(call_id: Any) -> Iterator[bool]:
    """A session advisory lock on the call, held across the (non-transactional) HTTP send."""
    key = _lock_key(call_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s::bigint)", [key])
        (acquired,) = cursor.fetchone()
    try:
        yield acquired
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s::bigint)", [key])


def is_sending(call_id: Any) -> bool:
    """True while some process holds the call's send lock. Only looks: taking the lock to test it could make
    a worker that arrives at that instant skip its send."""
    key = _lock_key(call_id) & 0xFFFFFFFFFFFFFFFF
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND granted)",
            [key >> 32, key & 0xFFFFFFFF],
        )
        (held,) = cursor.fetchone()
    return bool(held)


@dataclass(frozen=True)
class Send:
    call: ToolCall
    round: Round | None  # None: the first tools/call

    @property
    def idempotency_key(self) -> str:
        return self.round.idempotency_key if self.round else send_idempotency_key(self.call.pk, 0)

    @property
    def attempts(self) -> int:
        return self.round.send_attempts if self.round else self.call.attempts


def _claim(call_id: Any) -> Send | None:
    """Claim the call's next send, or None when there is nothing to send."""
    now = timezone.now()
    with transaction.atomic():
        call = ToolCall.objects.select_related("server").get(pk=call_id)
        if call.kind != ToolCall.Kind.CALL or call.is_final:
            return None
        rnd = call.rounds.exclude(status=Round.Status.CLOSED).order_by("-number").first()
        if rnd is not None and rnd.kind == Round.Kind.PUSH:
            return None  # answered on the holder's session, never re-sent
        if rnd is None:
            if call.rounds.exists():
                return None
            claimed = ToolCall.objects.filter(
                pk=call.pk, status__in=[ToolCall.Status.QUEUED, ToolCall.Status.RUNNING]
            ).update(
                status=ToolCall.Status.RUNNING,
                attempts=F("attempts") + 1,
                updated_at=now,
                started_at=call.started_at or now,
            )
            if not claimed:
                return None
            call.refresh_from_db()
            return Send(call, None)
        claimed = Round.objects.filter(
            pk=rnd.pk, status__in=[Round.Status.READY, Round.Status.SENDING]
        ).update(
            status=Round.Status.SENDING,
            send_attempts=F("send_attempts") + 1,
            send_started_at=rnd.send_started_at or now,
        )
        if not claimed:
            return None
        rnd.refresh_from_db()
        if rnd.send_attempts > 1:
            audit.record(
                actor=SYSTEM,
                verb="round.resent",
                call=call,
                data={
                    "round": rnd.number,
                    "attempt": rnd.send_attempts,
                    "idempotency_key": rnd.idempotency_key,
                },
            )
        return Send(call, rnd)


def call_send(*, call_id: Any) -> float | None:
    """Send whatever the call needs next, looping while the server answers with state only.

    Returns a countdown in seconds when a transient fault should be retried later, else None.
    """
    if holding.hand_to_holders(call_id):
        return None  # it runs on a holder's session, never from here
    with send_lock(call_id) as acquired:
        if not acquired:
            return None
        while True:
            send = _claim(call_id)
            if send is None:
                return None
            # _claim only yields hub-driven calls, and the database refuses one of those without a server.
            assert send.call.server is not None
            try:
                outcome = mcp_client.run(
                    mcp_client.call_tool(
                        server_config(send.call.server),
                        send.call.tool,
                        send.call.arguments,
                        input_responses=input_responses(send.round) if send.round else None,
                        request_state=send.round.request_state if send.round else None,
                        idempotency_key=send.idempotency_key,
                    )
                )
            except mcp_client.TransientError as exc:
                return _transient(send, exc)
            except mcp_client.PermanentError as exc:
                _fail(send, exc)
                server_after_send(send.call.server, send.call.tool, error=exc)
                return None
            # Before the answer is applied: a round routes on the tool's annotations in the stored list.
            server_after_send(send.call.server, send.call.tool, outcome=outcome)
            if not _apply(send, outcome, received_at=timezone.now()):
                return None


def _transient(send: Send, exc: mcp_client.McpError) -> float | None:
    if send.attempts > settings.ELICIT_MCP_MAX_RETRIES:
        _fail(send, exc, note=f" (gave up after {send.attempts} attempts)")
        return None
    backoff = min(settings.ELICIT_MCP_RETRY_MAX, settings.ELICIT_MCP_RETRY_BASE * 2 ** (send.attempts - 1))
    countdown: float = max(exc.retry_after or 0, backoff * random.uniform(0.5, 1.0))
    countdown = min(countdown, settings.ELICIT_MCP_RETRY_MAX)
    logger.warning("call %s: %s; retrying in %.1f s", send.call.pk, exc.code, countdown)
    with transaction.atomic():
        audit.record(
            actor=SYSTEM,
            verb="call.retry_scheduled",
            call=send.call,
            data={
                "code": exc.code,
                "message": exc.message,
                "attempt": send.attempts,
                "countdown": round(countdown, 1),
            },
        )
    return countdown


def _fail(send: Send, exc: mcp_client.McpError, note: str = "") -> None:
    error: dict[str, Any] = {"code": exc.code, "message": exc.message + note}
    if exc.rpc_code is not None:
        error["rpc_code"] = exc.rpc_code
    with transaction.atomic():
        if send.round:
            _close(send.round)
        call_finish(call=send.call, status=ToolCall.Status.FAILED, error=error)


def _close(rnd: Round) -> None:
    Round.objects.filter(pk=rnd.pk).exclude(status=Round.Status.CLOSED).update(
        status=Round.Status.CLOSED, closed_at=timezone.now()
    )


def _apply(send: Send, outcome: mcp_client.Outcome, *, received_at: Any) -> bool:
    """Record the server's answer. True when the next send is due at once (a state-only round)."""
    call = send.call
    with transaction.atomic():
        # Cancelled (or deleted) while the send was in flight: the server's answer is recorded, not applied.
        locked = ToolCall.objects.select_for_update().filter(pk=call.pk).first()
        if locked is None or locked.status not in (ToolCall.Status.RUNNING, ToolCall.Status.RESUMING):
            audit.record(
                actor=SYSTEM,
                verb="call.outcome_discarded",
                call=call,
                data={"reason": f"the call was {locked.status if locked else 'deleted'} meanwhile"},
            )
            return False
        if send.round:
            _close(send.round)
        if isinstance(outcome, mcp_client.Completed | mcp_client.ToolError):
            expired = send.round is not None and send.round.outcome == Round.Outcome.EXPIRED
            call_finish(
                call=call,
                status=ToolCall.Status.EXPIRED if expired else ToolCall.Status.COMPLETED,
                result=outcome.result,
            )
            return False
        if call.rounds.count() >= MAX_ROUNDS:
            call_finish(
                call=call,
                status=ToolCall.Status.FAILED,
                error={
                    "code": "too_many_rounds",
                    "message": f"The server asked for input {MAX_ROUNDS} times; the hub stopped.",
                },
            )
            return False
        rnd = round_open(
            call=call,
            input_requests=outcome.input_requests,
            raw=outcome.raw,
            request_state=outcome.request_state,
            received_at=received_at,
        )
        rnd.refresh_from_db()
        if rnd.status == Round.Status.OPEN:
            ToolCall.objects.filter(pk=call.pk).update(
                status=ToolCall.Status.AWAITING_INPUT, updated_at=timezone.now()
            )
            return False
        return True
