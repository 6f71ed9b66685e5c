"""Calls held on a holder's session: claiming them, push rounds, heartbeats, and holders that are lost.

Handshake-era servers (and stdio servers) ask for input in the middle of ``tools/call``, on the open session,
so such a call lives in one holder process (``manage.py run_holder``) from its send to its end. Celery never
sends it (`sending.call_send` hands it over); a holder claims it with one conditional UPDATE, and everything
it records goes through here. Holders are woken by PostgreSQL ``NOTIFY`` on `CHANNEL` (payload ``work`` or
``call:<id>``); they also poll, so a lost notice only delays.

A push round (``elicitation/create`` on the session) is a `Round` of kind PUSH opened through the same
`round_open` as ``input_required`` rounds: routing, policies, N-of-M, audit, webhooks and the queues treat
it alike. It is answered on the session, never by a Celery retry; when the server stops waiting, or the
holder is lost, it closes GONE.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from approvals import broadcast, safejson
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.mcp_client import Completed, McpError, ServerConfig, ToolError
from approvals.mcp_client.session import Mode
from approvals.models import Holder, InputRequest, McpServer, Round, ToolCall, send_idempotency_key
from approvals.services import sending
from approvals.services.calls import call_finish, call_outcome_discarded
from approvals.services.gates import gate_at_send, gate_refresh_tools
from approvals.services.rounds import (
    HOLDER_CHANNEL,
    last_round_number,
    notify_holders,
    round_open,
)
from approvals.services.sending import call_limit, call_progress, progress_json, safe_to_resend
from approvals.services.servers import server_config

logger = logging.getLogger(__name__)
SYSTEM = Actor.system()
CHANNEL = HOLDER_CHANNEL
URL_ROUND_KEY_MAX = 200

# Calls whose server needs a session (McpServer.needs_session, in SQL).
_NEEDS_SESSION = (
    "(s.transport = 'stdio' OR s.era = 'handshake' OR (s.era = 'auto' AND s.probe ->> 'era' = 'handshake'))"
)


notify = notify_holders


# ---- holders -----------------------------------------------------------------------------------------


class NameTaken(Exception):
    """A live holder is registered under the name (`holder_start`)."""


def holder_start(*, name: str) -> int:
    """Register a holder named `name`; its id. Raises `NameTaken` while a live holder has that name.

    A holder started again under the name it had (``run_holder --name``, after a crash or a kill that left
    its row) takes the name over once the old row's heartbeat is stale: the old holder is declared lost
    first, as the sweep would (its sent calls fail ``holder_lost``, its unsent ones go back to the queue)."""
    stale = timezone.now() - timedelta(seconds=settings.ELICIT_HOLDER_STALE)
    old = Holder.objects.filter(name=name).first()
    if old is not None:
        if old.heartbeat_at >= stale:
            raise NameTaken(name)
        _declare_lost(old, stale)
    try:
        with transaction.atomic():
            holder = Holder.objects.create(name=name)
    except IntegrityError:  # another process of that name registered at the same moment
        raise NameTaken(name) from None
    logger.info("holder %s started", name)
    return holder.pk


# A holder's heartbeat once a sweep has declared it lost (`holders_sweep`), until its row is deleted: its
# calls are being ended, and neither its heartbeat nor its claims may bring it back meanwhile.
LOST = datetime(1970, 1, 1, tzinfo=UTC)


def _live(holder_id: int) -> Any:
    return Holder.objects.filter(pk=holder_id).exclude(heartbeat_at=LOST)


def holder_beat(*, holder_id: int, sessions: int) -> bool:
    """Record that the holder is alive. False when it was declared lost meanwhile: it must stop."""
    return bool(_live(holder_id).update(heartbeat_at=timezone.now(), sessions=max(0, sessions)))


def holder_claim(*, holder_id: int, limit: int, stdio: bool = False) -> list[str]:
    """Claim up to `limit` queued calls for this holder (one UPDATE; concurrent holders skip each other's
    rows). stdio servers' calls only when `stdio` (this holder can run stdio servers) and the server's lease
    is free, this holder's, or held by a holder whose heartbeat is stale."""
    if limit <= 0:
        return []
    transports = "" if stdio else "AND s.transport = 'http'"
    # A lease held by a holder whose heartbeat is stale does not keep the server's calls waiting for beat's
    # sweep: the holder that claims one takes the lease over (`stdio.stdio_lease_take`).
    lease = """AND (s.transport = 'http' OR s.stdio_holder_id IS NULL OR s.stdio_holder_id = %s OR EXISTS (
        SELECT 1 FROM approvals_holder h WHERE h.id = s.stdio_holder_id AND h.heartbeat_at < %s
    ))"""
    # A stdio server runs one call at a time (`StdioSupervisor.session`): its queued calls are claimed one by
    # one, the oldest once none of its calls is open here. Claimed all at once, they would wait for the one
    # session as "running" calls that were never sent, and fill this holder's room while other servers'
    # calls wait in the queue.
    one_at_a_time = """AND (s.transport = 'http' OR (
        NOT EXISTS (
            SELECT 1 FROM approvals_toolcall o
            WHERE o.server_id = s.id AND o.holder_id = %s AND NOT (o.status = ANY(%s))
        )
        AND c.id = (
            SELECT q.id FROM approvals_toolcall q
            WHERE q.server_id = s.id AND q.kind = 'call' AND q.status = 'queued' AND q.holder_id IS NULL
            ORDER BY q.created_at, q.id LIMIT 1
        )
    ))"""
    # A materialized CTE: a subquery under IN may be re-run by the planner, claiming more than `limit` rows.
    sql = f"""
        WITH picked AS MATERIALIZED (
            SELECT c.id FROM approvals_toolcall c JOIN approvals_mcpserver s ON s.id = c.server_id
            WHERE c.kind = 'call' AND c.status = 'queued' AND c.holder_id IS NULL AND s.enabled
              AND {_NEEDS_SESSION} {transports} {lease} {one_at_a_time}
            ORDER BY c.created_at LIMIT %s
            FOR UPDATE OF c SKIP LOCKED
        )
        UPDATE approvals_toolcall t SET holder_id = %s, status = 'running', updated_at = now()
        FROM picked WHERE t.id = picked.id
        RETURNING t.id
    """  # noqa: S608  (no user input in the formatted parts)
    finals = [str(status) for status in ToolCall.Status.finals()]
    with transaction.atomic():
        # Locked: a sweep declaring this holder lost waits for the claim, whose calls it then ends too.
        if _live(holder_id).select_for_update(no_key=True).values_list("pk", flat=True).first() is None:
            return []
        with connection.cursor() as cursor:
            stale = timezone.now() - timedelta(seconds=settings.ELICIT_HOLDER_STALE)
            cursor.execute(sql, [holder_id, stale, holder_id, finals, limit, holder_id])
            ids = [str(row[0]) for row in cursor.fetchall()]
        holder = Holder.objects.get(pk=holder_id)
        for call in ToolCall.objects.filter(pk__in=ids):
            audit.record(actor=SYSTEM, verb="call.held", call=call, data={"holder": holder.name})
            transaction.on_commit(lambda c=call: broadcast.call_changed(c))  # type: ignore[misc]
    return ids


# ---- one held call -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeldCall:
    """What the holder needs to run one call (plain data; secrets only inside `config`)."""

    call_id: str
    server_id: int
    transport: str
    mode: Mode  # "legacy" (handshake era) or "auto"
    config: ServerConfig
    tool: str
    arguments: dict[str, Any]
    limit: float  # seconds the call may run (paused while a person decides)
    elicitation_wait: int
    idempotency_key: str
    definition: dict[str, Any] | None = None  # the tool as the server's stored tools/list gives it


def held_call(*, call_id: Any, holder_id: int) -> HeldCall | None:
    """The call as this holder runs it, or None when it is no longer this holder's to run."""
    call = (
        ToolCall.objects.select_related("server")
        .filter(pk=call_id, holder_id=holder_id)
        .exclude(status__in=ToolCall.Status.finals())
        .first()
    )
    if call is None or call.server is None:
        return None
    server = call.server
    return HeldCall(
        call_id=str(call.pk),
        server_id=server.pk,
        transport=server.transport,
        mode="auto" if server.era == McpServer.Era.AUTO else "legacy",
        config=server_config(server),
        tool=call.tool,
        arguments=dict(call.arguments or {}),
        limit=call_limit(call),
        elicitation_wait=server.elicitation_wait,
        idempotency_key=send_idempotency_key(call.pk, 0),
        definition=server.tool(call.tool),
    )


def held_sending(*, call_id: Any, holder_id: int) -> bool:
    """Just before ``tools/call`` leaves: from now on the tool may have run. False: do not send.

    A gated call's first send is checked against its approval first (`gates.gate_at_send`): one that no
    longer matches leaves this holder for a new gate."""
    gate_refresh_tools(call_id)
    with transaction.atomic():
        call = _locked_open_call(call_id)
        if call is None or call.holder_id != holder_id or call.status != ToolCall.Status.RUNNING:
            return False
        if call.started_at is None and not gate_at_send(call):
            return False
        now = timezone.now()
        return bool(
            ToolCall.objects.filter(pk=call_id, holder_id=holder_id, status=ToolCall.Status.RUNNING).update(
                started_at=now, attempts=1, updated_at=now
            )
        )


def held_release(*, call_id: Any, holder_id: int, reason: str) -> bool:
    """Give back a call that never left this holder (another holder may take it)."""
    with transaction.atomic():
        released = ToolCall.objects.filter(
            pk=call_id, holder_id=holder_id, status=ToolCall.Status.RUNNING, started_at__isnull=True
        ).update(holder=None, status=ToolCall.Status.QUEUED, updated_at=timezone.now())
        if released:
            notify()
            logger.info("call %s released: %s", call_id, reason)
    return bool(released)


def held_ended(*, call_id: Any) -> bool:
    """The held call has ended while its tools/call runs (the agent cancelled it, say)."""
    return ToolCall.objects.filter(pk=call_id, status__in=ToolCall.Status.finals()).exists()


def held_stopped(*, call_id: Any, holder: str) -> None:
    """The holder stopped waiting for an ended call's result and told the server to stop the tool."""
    call = ToolCall.objects.filter(pk=call_id).first()
    if call is not None:
        audit.record(  # its own transaction: the chain's append begins one outside any
            actor=SYSTEM,
            verb="call.stop_sent",
            call=call,
            data={"status": call.status, "holder": holder, "sent": "notifications/cancelled"},
        )


def _locked_open_call(call_id: Any) -> ToolCall | None:
    """The call, locked, unless it is final; its rounds not yet closed are locked first, in the order an
    answer and an agent's cancel take them (the round, then the call): the other way round, a holder's
    end of the call (which closes its open round) deadlocked against a cancel, and one was aborted."""
    list(
        Round.objects.filter(call_id=call_id)
        .exclude(status=Round.Status.CLOSED)
        .select_for_update(of=("self",), no_key=True)
        .values_list("pk", flat=True)
    )
    return (
        ToolCall.objects.select_for_update(of=("self",), no_key=True)
        .select_related("server")
        .filter(pk=call_id)
        .exclude(status__in=ToolCall.Status.finals())
        .first()
    )


def held_finish(
    *,
    call_id: Any,
    outcome: Completed | ToolError | None = None,
    error: McpError | None = None,
    sent: bool,
    holder_id: int | None = None,
) -> bool:
    """Record how a held call ended: its result, or the error (with whether the tool may have run).

    `holder_id`: the holder whose session ended so. A call no longer that holder's is left alone: its holder
    was declared lost meanwhile and the call, never sent there, went back to the queue; another holder may
    be running it now, and this session's failure says nothing of that run."""
    with transaction.atomic():
        call = _locked_open_call(call_id)
        if call is not None and holder_id is not None and call.holder_id != holder_id:
            logger.warning("call %s: its end on a holder it is no longer held by was dropped", call_id)
            return False
        if call is None:
            final = ToolCall.objects.filter(pk=call_id).first()
            if final is not None:
                call_outcome_discarded(call=final, status=final.status)
            return False
        _close_open_rounds(call, why="the call ended")
        ToolCall.objects.filter(pk=call.pk).update(holder=None)
        if outcome is not None:
            return call_finish(call=call, status=ToolCall.Status.COMPLETED, result=outcome.result)
        assert error is not None
        # The message may quote the server (a -32042's own message): kept storable.
        message = safejson.storable_text(error.message)
        code = error.code
        if sent and error.may_have_run and code != sending.OUTCOME_UNKNOWN:
            # The call reached the server and its answer did not come, or came unreadable: its outcome is
            # unknown, as a worker's send that fails so (`sending._fail_unknown`), not the network's fault.
            code = sending.OUTCOME_UNKNOWN
            message = (
                f"{message.rstrip('.')}. The tool may have run: the hub does not send it again, because the "
                "server's answer does not say whether it ran. Check the server before calling it again."
            )
        body: dict[str, Any] = {"code": code, "message": message, "tool_may_have_run": sent}
        if error.rpc_code is not None:
            body["rpc_code"] = error.rpc_code
        return call_finish(call=call, status=ToolCall.Status.FAILED, error=body)


def held_failed(*, call_id: Any, holder_id: int, why: str) -> bool:
    """The holder's task for the call failed in a way nobody expected (`why`: what it raised). The call ends
    ``failed``, never left ``running``: ``outcome_unknown`` once tools/call had been sent (the tool may have
    run; it is not sent again), else ``holder_error``."""
    with transaction.atomic():
        call = _locked_open_call(call_id)
        if call is None or call.holder_id != holder_id:
            return False
        sent = call.started_at is not None
        _close_open_rounds(call, why="the holder failed")
        ToolCall.objects.filter(pk=call.pk).update(holder=None)
        if sent:
            code = sending.OUTCOME_UNKNOWN
            message = (
                f"The holder running this call failed ({why}) after tools/call had been sent. The tool may "
                "have run: the hub does not send it again. Check the server before calling it again."
            )
        else:
            code = "holder_error"
            message = (
                f"The holder running this call failed ({why}) before tools/call was sent; it did not run."
            )
        error = {"code": code, "message": message, "tool_may_have_run": sent}
        return call_finish(call=call, status=ToolCall.Status.FAILED, error=error)


def held_progress(*, call_id: Any, progress: float, total: float | None, message: str | None) -> None:
    value = progress_json(progress, total, safejson.storable_text(message) if message else message)
    if value is not None:
        call_progress(call_id=call_id, progress=value)


# ---- push rounds -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PushOpened:
    round_id: int | None  # None: nothing was opened (the call ended, or it already has an open round)
    answer: dict[str, Any] | None  # set when the round needs no person (e.g. an unsupported request)


def push_open(*, call_id: Any, params: dict[str, Any], server_waits: bool = True) -> PushOpened:
    """The server asked on the session (or refused with -32042): park one round of kind PUSH.

    `server_waits`: an ``elicitation/create`` the server waits for (its deadline is shown); False for the
    URLs of a -32042 refusal, which nobody waits on."""
    now = timezone.now()
    with transaction.atomic():
        call = _locked_open_call(call_id)
        if call is None or call.server is None:
            return PushOpened(None, {"action": "cancel"})
        if call.rounds.exclude(status=Round.Status.CLOSED).exists():
            # A second elicitation while the first waits (a server asking in parallel): one at a time. No
            # person saw it, so it is cancelled (dismissed), not declined (a person's "no").
            logger.warning("call %s: a second elicitation while one waits; cancelled", call.pk)
            return PushOpened(None, {"action": "cancel"})
        last = last_round_number(call)
        if last >= sending.MAX_ROUNDS:
            _too_many_rounds(call)
            return PushOpened(None, {"action": "cancel"})
        if server_waits:
            requests = {"elicitation": {"method": "elicitation/create", "params": params}}
        else:
            requests = {
                _url_key(item, n): {"method": "elicitation/create", "params": item}
                for n, item in enumerate(params.get("elicitations") or [], start=1)
            }
        try:
            with transaction.atomic():
                rnd = round_open(
                    call=call,
                    input_requests=requests,
                    raw={"method": "elicitation/create", "params": params},
                    request_state=None,
                    received_at=now,
                    kind=Round.Kind.PUSH,
                    server_deadline=now + timedelta(seconds=call.server.elicitation_wait)
                    if server_waits
                    else None,
                    number=last + 1,
                )
        except IntegrityError:  # another question of the call opened its round first: as above
            return PushOpened(None, {"action": "cancel"})
        rnd.refresh_from_db()
        if rnd.status != Round.Status.OPEN:
            return PushOpened(rnd.pk, _take_answer(rnd))
        ToolCall.objects.filter(pk=call.pk, status=ToolCall.Status.RUNNING).update(
            status=ToolCall.Status.AWAITING_INPUT, updated_at=timezone.now()
        )
        transaction.on_commit(lambda: broadcast.call_changed(call))
    return PushOpened(rnd.pk, None)


def _url_key(item: dict[str, Any], n: int) -> str:
    """A -32042 URL's key in its round: its elicitationId, unless the hub cannot store that."""
    key = str(item.get("elicitationId") or "")[:URL_ROUND_KEY_MAX]
    return key if key and not safejson.text_problem(key) else f"url-{n}"


def _too_many_rounds(call: ToolCall) -> None:
    """The server asks once more than `sending.MAX_ROUNDS` allows: the call ends as a 2026-07-28 call does
    (``too_many_rounds``), its question is answered ``cancel``, and the holder stops the tool (its notice
    ``call:<id>`` makes it send the server ``notifications/cancelled``; audit ``call.stop_sent``). The
    tool had been sent: it may have run."""
    logger.warning(
        "call %s: the server asked for input more than %d times; ended", call.pk, sending.MAX_ROUNDS
    )
    ToolCall.objects.filter(pk=call.pk).update(holder=None)
    call_finish(
        call=call,
        status=ToolCall.Status.FAILED,
        error=sending.too_many_rounds_error(tool_may_have_run=True),
    )
    notify_holders(f"call:{call.pk}")


def _take_answer(rnd: Round) -> dict[str, Any]:
    """Close an answered push round and give the ElicitResult for the session; the call runs again."""
    now = timezone.now()
    Round.objects.filter(pk=rnd.pk).exclude(status=Round.Status.CLOSED).update(
        status=Round.Status.CLOSED, closed_at=now
    )
    ToolCall.objects.filter(
        pk=rnd.call_id, status__in=[ToolCall.Status.AWAITING_INPUT, ToolCall.Status.RESUMING]
    ).update(status=ToolCall.Status.RUNNING, updated_at=now)
    requests = list(rnd.input_requests.all())
    if rnd.outcome == Round.Outcome.EXPIRED or not requests:
        return {"action": "cancel"}
    return requests[0].as_input_response()


def push_answer(*, round_id: int) -> dict[str, Any] | None:
    """The answer to give the server, once the round has one (None: still waiting).

    A round closed otherwise (the call was cancelled, the round is gone) answers ``cancel``."""
    with transaction.atomic():
        rnd = Round.objects.select_for_update(of=("self",), no_key=True).filter(pk=round_id).first()
        if rnd is None:
            return {"action": "cancel"}
        if rnd.status == Round.Status.OPEN:
            return None
        if rnd.status == Round.Status.CLOSED:
            if rnd.outcome in (Round.Outcome.ANSWERED, Round.Outcome.EXPIRED) and rnd.answered_at:
                return _answers_of(rnd)
            return {"action": "cancel"}
        answer = _take_answer(rnd)
        transaction.on_commit(lambda: broadcast.call_changed(rnd.call))
        return answer


def _answers_of(rnd: Round) -> dict[str, Any]:
    first = rnd.input_requests.exclude(status=InputRequest.Status.PENDING).first()
    return first.as_input_response() if first and first.action else {"action": "cancel"}


def push_gone(*, round_id: int, why: str, undelivered: bool = False) -> bool:
    """The server stopped waiting (or the session ended): the round and its pending requests are GONE.

    `undelivered`: the server will never read an answer now (it cancelled its request, the session ended), so
    a round already answered but whose answer the holder had not given yet is GONE as well: left as it was,
    it would stay the call's open round, and the server's next question would be declined for it."""
    statuses = [Round.Status.OPEN, Round.Status.READY] if undelivered else [Round.Status.OPEN]
    with transaction.atomic():
        rnd = (
            Round.objects.select_for_update(of=("self",), no_key=True)
            .select_related("call")
            .filter(pk=round_id, status__in=statuses)
            .first()
        )
        if rnd is None:
            return False
        if rnd.status == Round.Status.READY:
            why = f"{why}; the answer was not delivered"
        _gone(rnd, why)
        ToolCall.objects.filter(pk=rnd.call_id, status=ToolCall.Status.AWAITING_INPUT).update(
            status=ToolCall.Status.RUNNING, updated_at=timezone.now()
        )
        transaction.on_commit(lambda: broadcast.call_changed(rnd.call))
    return True


def _gone(rnd: Round, why: str) -> None:
    now = timezone.now()
    pending = list(rnd.input_requests.pending())
    InputRequest.objects.filter(pk__in=[ir.pk for ir in pending], status=InputRequest.Status.PENDING).update(
        status=InputRequest.Status.GONE, action=InputRequest.Action.CANCEL, answered_at=now
    )
    Round.objects.filter(pk=rnd.pk).exclude(status=Round.Status.CLOSED).update(
        status=Round.Status.CLOSED, closed_at=now, outcome=Round.Outcome.GONE
    )
    audit.record(
        actor=SYSTEM,
        verb="round.gone",
        call=rnd.call,
        data={"round": rnd.number, "why": why, "keys": [ir.key for ir in pending]},
    )
    call_id = rnd.call_id
    transaction.on_commit(lambda: broadcast.queue_changed("round.closed", call_id, pending))


def _close_open_rounds(call: ToolCall, *, why: str) -> None:
    """Close the call's rounds not closed yet. A push round answered but whose answer the holder had not
    given the server yet is GONE as well (as in `push_gone` with `undelivered`): the session that would have
    carried it has ended, and the answer, recorded, must not read as one the server had."""
    for rnd in call.rounds.exclude(status=Round.Status.CLOSED):
        if rnd.status == Round.Status.OPEN:
            _gone(rnd, why)
        elif rnd.status == Round.Status.READY and rnd.kind == Round.Kind.PUSH:
            _gone(rnd, f"{why}; the answer was not delivered")
        else:
            Round.objects.filter(pk=rnd.pk).update(status=Round.Status.CLOSED, closed_at=timezone.now())


def url_round_done(*, round_id: int) -> tuple[bool, dict[str, Any]]:
    """After a -32042 round is answered: (may the call be re-sent?, the answers as ``{key: action}``)."""
    rnd = Round.objects.select_related("call__server").get(pk=round_id)
    answers = {ir.key: ir.action for ir in rnd.input_requests.all()}
    accepted = bool(answers) and all(action == InputRequest.Action.ACCEPT for action in answers.values())
    return accepted and safe_to_resend(rnd.call), answers


# ---- holders that stop or are lost -------------------------------------------------------------------


def _lose(holder: Holder, why: str) -> int:
    """End every call `holder` held: unsent ones go back to the queue, sent ones fail ``holder_lost``."""
    return holder_calls_lost(holder_id=holder.pk, why=why)


def holder_calls_lost(*, holder_id: int, why: str, server_id: int | None = None) -> int:
    """End the open calls the holder held (on `server_id` only, when given) as a lost holder's: one not sent
    yet goes back to the queue; one sent fails ``holder_lost``, its tool may have run, and it is never sent
    again. Each call is locked, so a call the holder ended meanwhile (it was only slow) is left as it ended.
    Returns how many failed."""
    calls = ToolCall.objects.filter(holder_id=holder_id).open()
    if server_id is not None:
        calls = calls.filter(server_id=server_id)
    ended = 0
    for call_id in calls.values_list("pk", flat=True):
        with transaction.atomic():
            call = _locked_open_call(call_id)
            if call is None or call.holder_id != holder_id:
                continue
            sent = call.started_at is not None
            if not sent:
                ToolCall.objects.filter(pk=call.pk).update(
                    holder=None, status=ToolCall.Status.QUEUED, updated_at=timezone.now()
                )
                notify()
                continue
            _close_open_rounds(call, why=why)
            ToolCall.objects.filter(pk=call.pk).update(holder=None)
            call_finish(
                call=call,
                status=ToolCall.Status.FAILED,
                error={
                    "code": "holder_lost",
                    "message": f"The session running this call ended ({why}). tools/call had been sent, so "
                    "the tool may have run; the hub does not send it again.",
                    "tool_may_have_run": True,
                },
            )
            ended += 1
    return ended


def holder_stop(*, holder_id: int, why: str = "the holder stopped") -> int:
    """A holder shutting down: its sessions end with it."""
    holder = Holder.objects.filter(pk=holder_id).first()
    if holder is None:
        return 0
    ended = _lose(holder, why)
    Holder.objects.filter(pk=holder_id).delete()
    return ended


def holders_sweep(*, now: datetime | None = None) -> int:
    """Declare lost every holder whose heartbeat is older than ELICIT_HOLDER_STALE; returns the calls
    that ended with it."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.ELICIT_HOLDER_STALE)
    return sum(_declare_lost(holder, stale) for holder in Holder.objects.filter(heartbeat_at__lt=stale))


def _declare_lost(holder: Holder, stale: datetime) -> int:
    """Declare `holder`, whose heartbeat is older than `stale`, lost: end its calls, delete its row. Returns
    the calls that failed with it."""
    with transaction.atomic():
        # Marked first, so two sweeps never declare the same holder lost twice, and so a holder that was
        # only slow does not come back by a heartbeat (or claim calls) while its calls are ended. One
        # marked by a sweep that did not finish is ended here (ending a call twice ends it once).
        if (
            Holder.objects.filter(pk=holder.pk, heartbeat_at__lt=stale)
            .exclude(heartbeat_at=LOST)
            .update(sessions=0, heartbeat_at=LOST)
        ):
            audit.record(
                actor=SYSTEM,
                verb="holder.lost",
                data={"holder": holder.name, "heartbeat_at": holder.heartbeat_at.isoformat()},
            )
    ended = _lose(holder, f"its holder process {holder.name} stopped answering")
    Holder.objects.filter(pk=holder.pk, heartbeat_at=LOST).delete()
    return ended
