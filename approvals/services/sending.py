"""Sending a call to its MCP server: the first tools/call, then one retry per answered round.

Exactly once: a send is claimed with a conditional UPDATE and performed while holding a PostgreSQL session
advisory lock on the call. A second task for the same call (a duplicate message, a beat recovery) cannot
take the lock while the first is sending, and finds nothing to claim once it has finished. If a worker dies
mid-send, its connection closes and the lock goes with it; the redelivered task then finds the send still
claimed (``running`` / ``sending``) and cannot know whether the server saw it.

Long tools run once: a send that may have reached the server and then failed in a way that does not prove
the server refused it (a time-out, a lost connection or stream, a 5xx: the client's ``may_have_run``), or
that a redelivered task finds still claimed, is sent again only when `safe_to_resend` says so (the tool is
read-only or idempotent, or the server honours ``Idempotency-Key``, and then with the same key); otherwise
the call ends ``failed`` with ``outcome_unknown`` and a person or the agent decides; even when safe, a send
found still claimed is sent again only as often as a failing server is retried (`_tries_left`). A worker
whose PostgreSQL session is lost mid-send keeps what it learned and writes it on a new session once it holds
the call's lock again (`_recorded`, for up to `RECORD_PATIENCE`). An answer lost after
the server accepted the call (malformed, too large) ends it ``outcome_unknown`` too, never re-sent. A
failure before the request left the hub, or one the server refused it with (a 429), releases the claim
(``queued`` / ``ready``) and is retried with backoff. Each
``tools/call`` is bounded by `call_limit`, and a task sends again (a state-only round) only while another
send still fits its time limit (`_Budget`); progress notifications are stored on the call (`call_progress`).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, connections, transaction
from django.db.models import Exists, OuterRef
from django.db.models.expressions import RawSQL
from django.utils import timezone

from approvals import broadcast, mcp_client
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import Gate, InputRequest, McpServer, Round, ToolCall, send_idempotency_key
from approvals.prepared import PreparedRead
from approvals.rules import read_hints
from approvals.services import leases, locks
from approvals.services.calls import call_finish, call_outcome_discarded, sent_and_put_back
from approvals.services.gates import gate_at_send, gate_refresh_tools
from approvals.services.rounds import input_responses, notify_holders, round_open
from approvals.services.servers import server_after_send, server_config
from approvals.services.webhooks import retry_wait

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
SYSTEM = Actor.system()
MAX_ROUNDS = 50


def too_many_rounds_error(**more: Any) -> dict[str, Any]:
    """The error of a call whose server asked for input more than `MAX_ROUNDS` times, in either era."""
    return {
        "code": "too_many_rounds",
        "message": f"The server asked for input {MAX_ROUNDS} times; the hub stopped.",
        **more,
    }


# Progress notifications are stored at most this often per call (the last one always lands).
PROGRESS_INTERVAL = 0.25
MAX_PROGRESS_MESSAGE = 500
OUTCOME_UNKNOWN = "outcome_unknown"
# How many times a send looks again, after letting go of the call's lock, for a round answered meanwhile.
RELOOKS = 3


def safe_to_resend(call: ToolCall) -> bool:
    """May this call's ``tools/call`` be sent again although the server may already have run it?

    Yes when the server honours ``Idempotency-Key`` (the re-send carries the same key), or when the tool
    is annotated ``idempotentHint`` true in the server's stored tool list, or is read-only as the routing
    rules read it (`rules.read_hints`): ``readOnlyHint`` true and not also ``destructiveHint`` true.
    """
    server = call.server
    if server is None:
        return False
    if server.honours_idempotency_key:
        return True
    annotations = (server.tool(call.tool) or {}).get("annotations")
    if not isinstance(annotations, dict):
        return False
    return annotations.get("idempotentHint") is True or read_hints(annotations)["readOnlyHint"][0]


MAX_TOOL_TIMEOUTS = 500  # entries in a server's tool_timeouts
MAX_TOOL_NAME = 200


def check_call_timeout(value: Any) -> int:
    """A time limit in whole seconds, from 1 to ``ELICIT_MAX_CALL_TIMEOUT``; raises ValueError saying why."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("A time limit is a whole number of seconds.")
    if not 1 <= value <= settings.ELICIT_MAX_CALL_TIMEOUT:
        raise ValueError(
            f"A time limit is from 1 to {settings.ELICIT_MAX_CALL_TIMEOUT} seconds (ELICIT_MAX_CALL_TIMEOUT)."
        )
    return int(value)


def check_tool_timeouts(value: Any) -> dict[str, int]:
    """Per-tool limits, ``{tool name: seconds}``; empty when none. Raises ValueError naming the bad entry."""
    if value in (None, "", {}):
        return {}
    if not isinstance(value, dict):
        raise ValueError('Per-tool limits are an object, e.g. {"build": 1800}.')
    if len(value) > MAX_TOOL_TIMEOUTS:
        raise ValueError(f"At most {MAX_TOOL_TIMEOUTS} per-tool limits.")
    checked = {}
    for name, seconds in value.items():
        if not name or len(name) > MAX_TOOL_NAME:
            raise ValueError(f"A tool name is 1 to {MAX_TOOL_NAME} characters.")
        try:
            checked[name] = check_call_timeout(seconds)
        except ValueError as exc:
            raise ValueError(f"{name[:60]!r}: {exc}") from None
    return checked


def call_limit(call: ToolCall) -> float:
    """Seconds the call's ``tools/call`` may run: the tool's own limit (``tool_timeouts``), else the server's
    ``call_timeout``, never above ``ELICIT_MAX_CALL_TIMEOUT``."""
    server = call.server
    assert server is not None
    limit: float = server.call_timeout
    per_tool = (server.tool_timeouts or {}).get(call.tool) if isinstance(server.tool_timeouts, dict) else None
    if isinstance(per_tool, int | float) and not isinstance(per_tool, bool) and per_tool > 0:
        limit = per_tool
    return float(max(1, min(limit, settings.ELICIT_MAX_CALL_TIMEOUT)))


def _tries_left(attempts: int) -> bool:
    """May a send found still claimed (its worker stopped mid-send) be sent again, as its `attempts`-th try?
    Even a tool safe to repeat is not sent for ever: a send that kills its worker each time (a crash, the OOM
    killer) comes back at once (``task_reject_on_worker_lost``). It gets the tries a failing server gets."""
    return attempts <= settings.ELICIT_MCP_MAX_RETRIES + 1


def _lock_key(call_id: Any) -> int:
    return locks.lock_key(f"send:{call_id}")


def send_lock(call_id: Any) -> AbstractContextManager[bool]:
    """A session advisory lock on the call, held across the (non-transactional) HTTP send."""
    return locks.try_lock(f"send:{call_id}")


def is_sending(call_id: Any, *, here: bool = False) -> bool:
    """True while some process (`here`: this session) holds the call's send lock, or (not `here`) a live
    process holds its send lease (`leases`: it lost the lock with its database session and will write what
    it learned). Only looks: taking the lock to test it could make a worker that arrives at that instant
    skip its send."""
    if not here and leases.held(call_id):
        return True
    key = _lock_key(call_id) & 0xFFFFFFFFFFFFFFFF
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND granted"
            " AND (NOT %s OR pid = pg_backend_pid()))",
            [key >> 32, key & 0xFFFFFFFF, here],
        )
        (held,) = cursor.fetchone()
    return bool(held)


@dataclass(frozen=True)
class Send:
    call: ToolCall
    round: Round | None  # None: the first tools/call
    # Claimed before and never released: an earlier attempt may have reached the server (a crash, a
    # redelivered or duplicate message, a time limit).
    redelivered: bool = False
    # The round's answers, read in the claim's transaction: nothing is read between the claim and the send,
    # so a database lost there cannot leave a send claimed that never left the hub (it would end
    # ``outcome_unknown``, or be sent as a re-send).
    responses: dict[str, dict[str, Any]] | None = None

    @property
    def idempotency_key(self) -> str:
        return self.round.idempotency_key if self.round else send_idempotency_key(self.call.pk, 0)

    @property
    def attempts(self) -> int:
        return self.round.send_attempts if self.round else self.call.attempts


# Every send reads these (twice per round: the call, then its retry), so they are compiled once per process.
# The server's default team too: the audit events name it.
# Not the server's probe nor a stdio server's `args` and `env`: a send uses none of them (a refusal that
# makes the hub probe the server again reads the probe then).
_CLAIMED_CALL = PreparedRead(
    lambda pk: (
        ToolCall.objects.select_related("server__default_team")
        .defer("server__probe", "server__args", "server__env")
        .filter(pk=pk)
    ),
    pk=ToolCall._meta.get_field("id"),
)
_A_ROUND_SENT = PreparedRead(
    lambda call: Round.objects.filter(call=call).exclude(kind=Round.Kind.GATE).values_list("pk")[:1],
    call=Round._meta.get_field("call"),
)
_LAST_OPEN_ROUND = PreparedRead(
    lambda call: Round.objects.filter(call=call).exclude(status=Round.Status.CLOSED).order_by("-number")[:1],
    call=Round._meta.get_field("call"),
)


def _claim(call_id: Any) -> Send | None:
    """Claim the call's next send, or None when there is nothing to send."""
    now = timezone.now()
    with transaction.atomic():
        call = _CLAIMED_CALL.first(pk=call_id)
        if call is None:
            raise ToolCall.DoesNotExist(f"no call {call_id}")
        if call.kind != ToolCall.Kind.CALL or call.is_final:
            return None
        if call.server is not None and not call.server.enabled:
            # Disabled since the call was queued: nothing more is sent to it. The call waits, as a holder
            # leaves it, until the server is enabled again (beat's `recover_stuck` queues it once more).
            return None
        rnd = _LAST_OPEN_ROUND.first(call=call.pk)
        if rnd is not None and rnd.kind in (Round.Kind.PUSH, Round.Kind.GATE):
            return None  # answered on the holder's session, never re-sent; or a gate still waiting
        if rnd is None:
            if _A_ROUND_SENT.first(call=call.pk) is not None:
                return None
            held = call.status == ToolCall.Status.RUNNING and call.attempts > 0
            if not held and not gate_at_send(call):
                return None  # the approval no longer matches the call: a new gate is open
            # The values the UPDATE writes are set on the call as they are, not read back. Only a send
            # changes `attempts`, under the lock this task holds: the count read above is the row's.
            claim = {
                "status": ToolCall.Status.RUNNING,
                "attempts": call.attempts + 1,
                "updated_at": now,
                "started_at": call.started_at or now,
            }
            claimed = ToolCall.objects.filter(
                pk=call.pk,
                status__in=[ToolCall.Status.QUEUED, ToolCall.Status.RUNNING],
                attempts=call.attempts,
            ).update(**claim)
            if not claimed:
                return None
            for field, value in claim.items():
                setattr(call, field, value)
            return Send(call, None, redelivered=held)
        held = rnd.status == Round.Status.SENDING
        claim = {
            "status": Round.Status.SENDING,
            "send_attempts": rnd.send_attempts + 1,
            "send_started_at": rnd.send_started_at or now,
        }
        claimed = Round.objects.filter(
            pk=rnd.pk,
            status__in=[Round.Status.READY, Round.Status.SENDING],
            send_attempts=rnd.send_attempts,
        ).update(**claim)
        if not claimed:
            return None
        for field, value in claim.items():
            setattr(rnd, field, value)
        # A re-send (not one the outcome-unknown rule stops: that ends the call instead).
        if rnd.send_attempts > 1 and (not held or (safe_to_resend(call) and _tries_left(rnd.send_attempts))):
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
        return Send(call, rnd, redelivered=held, responses=input_responses(rnd))


_WHERE_SENT = PreparedRead(
    lambda pk: (
        ToolCall.objects.filter(pk=pk, kind=ToolCall.Kind.CALL, server__isnull=False)
        .annotate(gated=Exists(Gate.objects.filter(call_id=OuterRef("pk"), status=Gate.Status.APPROVED)))
        .values_list(
            "status",
            "holder_id",
            "server__transport",
            "server__era",
            "server__probe__era",
            "gated",
            "grant_id",
            "started_at",
            "server__enabled",
        )
    ),
    pk=ToolCall._meta.get_field("id"),
)


def _hand_to_holders(call_id: Any) -> bool:
    """True when nothing is sent from here: there is no such call to send, its server is disabled (`_claim`
    has the last word), or it runs on a holder's session
    (handshake era, stdio; the holders are woken if it still waits for one). Before the first send of a gated
    call, or of one a grant let through, the server's tool list is refreshed when stale
    (`gate_refresh_tools`).

    A send a worker claimed (being sent, no holder) stays the workers' even if its server needs a session
    now (its era changed since): holders take only unclaimed calls, and `_claim` ends it as it must.

    One narrow read: every send passes here, and most find nothing to hand over."""
    row = _WHERE_SENT.first(pk=call_id)
    if row is None:
        return True
    status, holder_id, transport, era, probed_era, gated, grant_id, started_at, enabled = row
    claimed_here = holder_id is None and status in ToolCall.Status.sending()
    if McpServer.session_needed(transport, era, probed_era) and not claimed_here:
        if status not in ToolCall.Status.finals() and holder_id is None:
            notify_holders()
        return True
    if not enabled:
        return True  # nothing goes to a disabled server, not even a tools/list (`_claim`)
    if gated or (grant_id is not None and started_at is None):
        gate_refresh_tools(call_id)  # checked against the tool list as the server has it now
    return False


def call_send(*, call_id: Any) -> float | None:
    """Send whatever the call needs next, looping while the server answers with state only.

    Returns a countdown in seconds when a transient fault should be retried later (0 when the next send is
    due at once and this task has no time left for it: `_Budget`), else None.
    """
    budget = _Budget(time.monotonic())
    if _hand_to_holders(call_id):
        return None  # no such call, or it runs on a holder's session, never from here
    for _ in range(RELOOKS + 1):
        with send_lock(call_id) as acquired:
            if not acquired:
                # Another task is sending this call; when it lets go it looks for an answer that came since.
                return None
            with leases.leased(call_id) as sent_elsewhere:
                if sent_elsewhere is not None:
                    # A live process is sending it, whose database session (and the lock with it) was lost:
                    # it writes the answer once it has the lock again. Look again once it is done or died.
                    return sent_elsewhere
                countdown, ended = _send_claimed(call_id, budget)
        if countdown is not None or ended or not _answered_meanwhile(call_id):
            return countdown
    return None


def _answered_meanwhile(call_id: Any) -> bool:
    """A round answered while this task held the call's lock: the task queued by that answer found the lock
    taken and gave up, so the holder sends the retry (else it would wait for `recover_stuck`)."""
    return bool(_READY_RETRY(call=call_id))


_READY_RETRY = PreparedRead(
    lambda call: Round.objects.filter(
        call=call, kind=Round.Kind.RETRY, status=Round.Status.READY
    ).values_list("pk", flat=True)[:1],
    call=Round._meta.get_field("call"),
)


@dataclass
class _Budget:
    """The time one task has for its sends. A task's time limits (ELICIT_CALL_TASK_SOFT_TIME_LIMIT) leave room
    for one send of the longest allowed call (ELICIT_MAX_CALL_TIMEOUT) and its overheads; a task cut by them
    mid-send leaves the send claimed, and a tool not safe to repeat then ends ``outcome_unknown``. So a task
    that has sent once sends again (a state-only round, a round answered meanwhile) only while another whole
    send of this call still fits; else the next send is a new task's."""

    started: float
    sent: ToolCall | None = None  # the call as this task last sent it

    def fits_another(self) -> bool:
        if self.sent is None:
            return True
        spent = time.monotonic() - self.started
        return spent <= settings.ELICIT_MAX_CALL_TIMEOUT - call_limit(self.sent)


def _send_claimed(call_id: Any, budget: _Budget) -> tuple[float | None, bool]:
    """`call_send`'s work under the call's lock: claim, send, apply; again while the server answers with
    state only. Returns a countdown when the send should be retried later (0: at once, by a new task, when
    this one has no time left for it), and whether the call ended here (then no answer can have come for it
    meanwhile)."""
    while True:
        if not budget.fits_another():
            logger.info("call %s: its next send is left to a new task (this one's time is spent)", call_id)
            return 0.0, False
        send = _claim(call_id)
        if send is None:
            return None, False
        budget.sent = send.call
        # _claim only yields hub-driven calls, and the database refuses one of those without a server.
        assert send.call.server is not None
        if send.redelivered and not safe_to_resend(send.call):
            _fail_unknown(send, "the hub stopped while sending this call")
            return None, True
        if send.redelivered and not _tries_left(send.attempts):
            _fail_unknown(
                send,
                f"the hub stopped while sending this call, {send.attempts - 1} times",
                because="it gave up after as many tries as a failing server gets (ELICIT_MCP_MAX_RETRIES)",
            )
            return None, True
        try:
            outcome: mcp_client.Outcome | mcp_client.McpError = mcp_client.run(
                mcp_client.call_tool(
                    server_config(send.call.server),
                    send.call.tool,
                    send.call.arguments,
                    input_responses=send.responses,
                    request_state=send.round.request_state if send.round else None,
                    idempotency_key=send.idempotency_key,
                    call_timeout=call_limit(send.call),
                    on_progress=ProgressWriter(send.call.pk),
                    # The stored definition: no tools/list before each send.
                    tool=send.call.server.tool(send.call.tool),
                )
            )
        except (mcp_client.TransientError, mcp_client.PermanentError) as exc:
            outcome = exc
        received_at = timezone.now()
        try:
            countdown, ended, again = _recorded(send, functools.partial(_record, send, outcome, received_at))
        except _TakenOver:
            return None, True
        _relist_after(send, outcome)
        if not again:
            return countdown, ended


def _record(
    send: Send, outcome: mcp_client.Outcome | mcp_client.McpError, received_at: Any
) -> tuple[float | None, bool, bool]:
    """Write what the send learned: (a countdown to retry later, whether the call ended, whether the next
    send is due at once)."""
    if isinstance(outcome, mcp_client.TransientError):
        if outcome.may_have_run and not safe_to_resend(send.call):
            _fail_unknown(send, outcome.message)
            return None, True, False
        countdown = _transient(send, outcome)
        return countdown, countdown is None, False
    assert send.call.server is not None
    if isinstance(outcome, mcp_client.McpError):
        # What the failure says about the server first: a refused stateless request re-probes it.
        server_after_send(send.call.server, send.call.tool, error=outcome)
        if _moved_to_session(send, outcome):
            return None, False, False
        if outcome.may_have_run:
            # The call reached the server and its answer does not say whether it ran: never sent again.
            _fail_unknown(send, outcome.message, answer_lost=True)
        else:
            _fail(send, outcome)
        return None, True, False
    if isinstance(outcome, mcp_client.InputRequired):
        # Before the round opens: it routes on the tool's annotations in the stored list. A result is written
        # first (`_relist_after`): a slow tools/list must not hold the answer of a tool that ran.
        server_after_send(send.call.server, send.call.tool, outcome=outcome)
    if _apply(send, outcome, received_at=received_at):
        return None, False, True
    # call_finish sets the final status on the call it was given.
    return None, send.call.is_final, False


def _relist_after(send: Send, outcome: mcp_client.Outcome | mcp_client.McpError) -> None:
    """What a result (complete, or a tool error) taught the hub about the server (`server_after_send`: a tool
    the stored list lacks, or one the server says it does not know), once the result is written."""
    if not isinstance(outcome, mcp_client.Completed | mcp_client.ToolError) or send.call.server is None:
        return
    try:
        server_after_send(send.call.server, send.call.tool, outcome=outcome)
    except Exception:  # the result is written; the next send or beat lists the tools again
        logger.exception("call %s: could not list the server's tools again", send.call.pk)


# How long a worker holding a server's answer waits for PostgreSQL to take its record, and how often it tries.
RECORD_PATIENCE = 60.0
RECORD_PAUSE = 1.0


class _TakenOver(Exception):
    """This worker's session, and the call's lock with it, was lost mid-send, and another worker has taken
    the call since: what this one learned is no longer its to write."""


def _recorded(send: Send, record: Callable[[], _T]) -> _T:
    """`record()`, which writes what a send learned. That knowledge exists only in this process: lost with a
    PostgreSQL session (a restart, a failover, the session ended), a tool that ran, or a request that never
    left, would later end ``outcome_unknown`` (or be sent again). So a write that failed with the session is
    tried again on a new one, for up to `RECORD_PATIENCE` seconds, once this worker holds the call's lock
    again (it went with the old session) and the send is still its own."""
    deadline = time.monotonic() + RECORD_PATIENCE
    while True:
        try:
            return record()
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline or _lock_kept(send.call.pk):
                raise
            logger.warning("call %s: PostgreSQL lost while recording the send; trying again", send.call.pk)
        _lock_again(send, deadline)


def _lock_kept(call_id: Any) -> bool:
    """Does this worker's session still hold the call's lock? No when the session it took the lock on was
    lost (Django may have opened another since), or when PostgreSQL does not answer."""
    try:
        return is_sending(call_id, here=True)
    except (OperationalError, InterfaceError):
        return False


def _lock_again(send: Send, deadline: float) -> None:
    """Take the call's lock on a new session, waiting for PostgreSQL until `deadline`; raises `_TakenOver`
    when another worker has claimed the call's send since this one's.

    A worker holding the lock without having claimed the send only looks at the call (a redelivered or
    duplicate task, `recover_stuck`'s): it finds this worker's lease and lets go at once, so this one waits
    for the lock, until `deadline`. Giving up then would lose the answer it holds."""
    while True:
        connection.close()
        time.sleep(RECORD_PAUSE)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s::bigint)", [_lock_key(send.call.pk)])
                (acquired,) = cursor.fetchone()
            claimed = _still_claimed(send)
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            continue
        if acquired and claimed:
            return
        if claimed and time.monotonic() <= deadline:
            logger.info("call %s: another worker looks at it; waiting for the lock", send.call.pk)
            continue
        logger.warning("call %s: another worker took it over while this one was away", send.call.pk)
        raise _TakenOver


def _still_claimed(send: Send) -> bool:
    """The send is still the one this worker claimed: no other worker has claimed it again since."""
    if send.round is not None:
        return Round.objects.filter(
            pk=send.round.pk, status=Round.Status.SENDING, send_attempts=send.round.send_attempts
        ).exists()
    return ToolCall.objects.filter(
        pk=send.call.pk, status=ToolCall.Status.RUNNING, attempts=send.call.attempts
    ).exists()


def _moved_to_session(send: Send, exc: mcp_client.McpError) -> bool:
    """A server of the handshake era refused the call's first stateless request (it runs nothing without a
    session), and the probe now says it needs one: the call goes back to the queue for a holder, once."""
    server = send.call.server
    if exc.code != "protocol_unsupported" or send.round is not None or send.attempts != 1 or exc.may_have_run:
        return False
    if server is None or not server.needs_session:
        return False
    with transaction.atomic():
        moved = ToolCall.objects.filter(
            pk=send.call.pk, status=ToolCall.Status.RUNNING, holder__isnull=True
        ).update(status=ToolCall.Status.QUEUED, started_at=None, updated_at=timezone.now())
        if not moved:
            return False
        audit.record(
            actor=SYSTEM,
            verb="call.moved_to_session",
            call=send.call,
            data={"server": server.slug, "era": (server.probe or {}).get("era"), "refused": exc.message},
        )
        notify_holders()
    return True


def _transient(send: Send, exc: mcp_client.McpError) -> float | None:
    if send.attempts > settings.ELICIT_MCP_MAX_RETRIES:
        _fail(send, exc, note=f" (gave up after {send.attempts} attempts)")
        return None
    backoff = settings.ELICIT_MCP_RETRY_BASE * 2 ** (send.attempts - 1)
    # The server's Retry-After, no sooner and spread a little (calls it refused together come back apart).
    countdown = retry_wait(backoff, retry_after=exc.retry_after, cap=settings.ELICIT_MCP_RETRY_MAX)
    logger.warning("call %s: %s; retrying in %.1f s", send.call.pk, exc.code, countdown)
    with transaction.atomic():
        # Release the claim: the retry then knows this attempt ended here, and is no redelivery. The call's
        # `updated_at` tells beat's `recover_stuck` that its retry is waiting out a countdown, not lost.
        if send.round:
            # The call's row first, then the round's, in the order a cancel and an answer lock them: the other
            # order deadlocked against an agent's cancel (PostgreSQL aborted the cancel).
            ToolCall.objects.filter(pk=send.call.pk).exclude(status__in=ToolCall.Status.finals()).update(
                updated_at=timezone.now()
            )
            released = Round.objects.filter(pk=send.round.pk, status=Round.Status.SENDING).update(
                status=Round.Status.READY
            )
        else:
            released = ToolCall.objects.filter(pk=send.call.pk, status=ToolCall.Status.RUNNING).update(
                status=ToolCall.Status.QUEUED, updated_at=timezone.now()
            )
        if not released:
            # Cancelled (or deleted) while the send was out: nothing is retried.
            _discard(send.call)
            return None
        audit.record(
            actor=SYSTEM,
            verb="call.retry_scheduled",  # read back by calls.sent_and_put_back (RETRY_SCHEDULED)
            call=send.call,
            data={
                "code": exc.code,
                "message": exc.message,
                "attempt": send.attempts,
                "countdown": round(countdown, 1),
                # What `sent_and_put_back` reads: the outcome stays unknown until a later send settles it.
                "round": send.round.number if send.round else 0,
                "may_have_run": exc.may_have_run,
            },
        )
    return countdown


def _fail(send: Send, exc: mcp_client.McpError, note: str = "") -> None:
    error: dict[str, Any] = {"code": exc.code, "message": exc.message + note}
    if exc.rpc_code is not None:
        error["rpc_code"] = exc.rpc_code
    # A tool safe to repeat, sent until the retries ran out: it may have run, on this send or an earlier one.
    if exc.may_have_run or sent_and_put_back(send.call.pk, send.round.number if send.round else 0):
        error["tool_may_have_run"] = True
    with transaction.atomic():
        if send.round:
            _close(send.round)
        call_finish(call=send.call, status=ToolCall.Status.FAILED, error=error)


def _fail_unknown(send: Send, why: str, *, answer_lost: bool = False, because: str = "") -> None:
    """End the call ``outcome_unknown``: the server may have run the tool, and sending it again is unsafe
    (or, `answer_lost`, the server's answer came and does not say whether the tool ran: lost after the server
    accepted the call, unreadable, or a status that proves no refusal; such a failure is never re-sent; or
    `because` says why else the hub stops sending it)."""
    logger.warning("call %s: outcome unknown (%s)", send.call.pk, why)
    because = because or (
        "the server's answer does not say whether it ran"
        if answer_lost
        else "the tool is not marked read-only or idempotent and the server does not honour Idempotency-Key"
    )
    error = {
        "code": OUTCOME_UNKNOWN,
        "message": (
            f"{why.rstrip('.')}. The tool may have run: the hub does not send it again, because {because}. "
            "Check the server before calling it again."
        ),
        "tool_may_have_run": True,
    }
    with transaction.atomic():
        if send.round:
            _close(send.round)
        call_finish(call=send.call, status=ToolCall.Status.FAILED, error=error)


def progress_json(progress: float, total: float | None, message: str | None) -> dict[str, Any] | None:
    """A server's progress notification as the call stores it (its message cut short and made storable)."""
    if not math.isfinite(progress):
        return None
    return {
        "progress": progress,
        "total": total if total is not None and math.isfinite(total) else None,
        "message": mcp_client.storable_text(message[:MAX_PROGRESS_MESSAGE]) if message else None,
        "at": timezone.now().isoformat(),
    }


def call_progress(*, call_id: Any, progress: dict[str, Any]) -> bool:
    """Store the last progress notification of a running call and tell its watchers. False when the call
    is no longer running (the notification came late)."""
    now = timezone.now()
    with transaction.atomic():
        updated = ToolCall.objects.filter(pk=call_id, status__in=ToolCall.Status.sending()).update(
            progress=progress, updated_at=now
        )
        if not updated:
            return False
        call = ToolCall.objects.only("id", "status").get(pk=call_id)
        # A tool that reports progress while people answer it (a pushed question): its queue cards redraw.
        asking = list(
            InputRequest.objects.filter(
                round__call_id=call_id, status=InputRequest.Status.PENDING
            ).select_related("team", "escalation_team")
        )
        transaction.on_commit(lambda: broadcast.call_changed(call))
        if asking:
            transaction.on_commit(lambda: broadcast.queue_changed("call.progress", call_id, asking))
    return True


def _store_progress(call_id: Any, progress: dict[str, Any]) -> None:
    """`call_progress` from a worker thread of the MCP client's event loop, on that thread's connection."""
    try:
        call_progress(call_id=call_id, progress=progress)
    except Exception:
        logger.exception("call %s: could not store progress", call_id)
    finally:
        connections.close_all()


class ProgressWriter:
    """The MCP client's progress callback for one call: stores the newest notification, at most once per
    `PROGRESS_INTERVAL` (notifications in between replace each other; the last one is always written)."""

    def __init__(self, call_id: Any) -> None:
        self.call_id = call_id
        self._pending: dict[str, Any] | None = None
        self._last = -math.inf
        self._writing = False

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        value = progress_json(progress, total, message)
        if value is None:
            return
        self._pending = value
        if self._writing:
            return  # the task writing now picks it up
        self._writing = True
        try:
            while self._pending is not None:
                wait = self._last + PROGRESS_INTERVAL - time.monotonic()
                if wait > 0:
                    await anyio.sleep(wait)
                value, self._pending = self._pending, None
                self._last = time.monotonic()
                await anyio.to_thread.run_sync(functools.partial(_store_progress, self.call_id, value))
        finally:
            self._writing = False


# A closed round's record keeps its size and the first keys (its audit event), not every key it declined.
_DROP_DECLINED_KEYS = RawSQL("CASE WHEN raw ? 'declined_keys' THEN raw - 'declined_keys' ELSE raw END", ())


def _close(rnd: Round) -> None:
    """Close a round whose retry the server answered (or that ended with its call). What only its retry
    needed goes with it: its ``requestState`` (only the latest round's is ever echoed) and the keys of a round
    refused as a whole (`rounds.TOO_MANY_INPUTS`). A server that sends a large state, or thousands of keys,
    a new one each round (rounds that need no person follow each other at once), would otherwise have every
    round keep its own until the call ends."""
    Round.objects.filter(pk=rnd.pk).exclude(status=Round.Status.CLOSED).update(
        status=Round.Status.CLOSED, closed_at=timezone.now(), request_state=None, raw=_DROP_DECLINED_KEYS
    )


# The call awaits input from now on, if it is still being sent; the number of its latest round comes back. One
# statement for the call's lock, the round's number and the call's new status: the round opened next in the
# same transaction either waits for a person or marks itself ready, which moves the call on itself.
_AWAIT_INPUT = (
    f"UPDATE {ToolCall._meta.db_table} AS c SET status = %s, updated_at = %s"  # noqa: S608 (model names only)
    " WHERE c.id = %s AND c.status = ANY(%s)"
    f" RETURNING (SELECT max(r.number) FROM {Round._meta.db_table} AS r WHERE r.call_id = c.id)"
)


def _await_input(call: ToolCall) -> int | None:
    """Lock the call and mark it ``awaiting_input`` if it is still being sent (``running`` / ``resuming``):
    the number of its latest round (0 before the first), or None when it was cancelled or deleted
    meanwhile."""
    with connection.cursor() as cursor:
        cursor.execute(
            _AWAIT_INPUT,
            [
                ToolCall.Status.AWAITING_INPUT.value,
                timezone.now(),
                call.pk,
                [str(status) for status in ToolCall.Status.sending()],
            ],
        )
        row = cursor.fetchone()
    return None if row is None else row[0] or 0


def _discard(call: ToolCall) -> bool:
    """The server's answer came for a call cancelled (or deleted) meanwhile: recorded, not applied."""
    status = ToolCall.objects.filter(pk=call.pk).values_list("status", flat=True).first()
    return call_outcome_discarded(call=call, status=status)


def _apply(send: Send, outcome: mcp_client.Outcome, *, received_at: Any) -> bool:
    """Record the server's answer. True when the next send is due at once (a state-only round)."""
    call = send.call
    with transaction.atomic():
        # Cancelled (or deleted) while the send was in flight: the server's answer is recorded, not applied.
        # The first statement is a conditional UPDATE of the call: it locks the row FOR NO KEY UPDATE (no key
        # changes), as every row lock the hub takes. That serialises the call's writers, yet lets a row that
        # references the call (a grant, a webhook delivery) commit meanwhile. FOR UPDATE would block that
        # row's foreign-key check, which runs at its COMMIT while it holds the audit chain's lock: a deadlock
        # with this transaction's own audit event (seen under load: a grant made as its call ran).
        if isinstance(outcome, mcp_client.Completed | mcp_client.ToolError):
            # The call's lock and its end in one UPDATE, conditional on its send being on its way.
            expired = send.round is not None and send.round.outcome == Round.Outcome.EXPIRED
            if not call_finish(
                call=call,
                status=ToolCall.Status.EXPIRED if expired else ToolCall.Status.COMPLETED,
                result=outcome.result,
                only_from=ToolCall.Status.sending(),
            ):
                return _discard(call)
            if send.round:
                _close(send.round)
            return False
        # input_required: the lock, the last round's number and the status the new round leaves the call in.
        last = _await_input(call)
        if last is None:
            return _discard(call)
        if send.round:
            _close(send.round)
        if last >= MAX_ROUNDS:
            # Each retry reached the server, which may have acted before it asked again.
            call_finish(
                call=call,
                status=ToolCall.Status.FAILED,
                error=too_many_rounds_error(tool_may_have_run=True),
            )
            return False
        rnd = round_open(
            call=call,
            input_requests=outcome.input_requests,
            raw=outcome.raw,
            request_state=outcome.request_state,
            received_at=received_at,
            number=last + 1,
        )
        # round_open marked it ready itself (on the row and on `rnd`) when no request waits for a person.
        if rnd.status != Round.Status.OPEN:
            return True
        call.status = ToolCall.Status.AWAITING_INPUT  # as written
        return False
