"""Rounds: opening one from an input_required result, marking it ready (expiry is in ``escalation``).

Shared by hub-driven calls and relays: both create the same Round and InputRequest rows.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from approvals import broadcast, cards, safejson, schema_forms, urlsafety
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.mcp_client.wire import MAX_DEPTH
from approvals.models import ExpiryAction, InputRequest, Round, ToolCall
from approvals.prepared import PreparedRead
from approvals.queueing import RUN_CALL, enqueue_on_commit
from approvals.services import notifications, webhooks
from approvals.services.routing import route_all

SYSTEM = Actor.system()
HOLDER_CHANNEL = "elicit_holders"  # PostgreSQL NOTIFY channel the holder processes listen on
# The flag of the one row that stands for a round refused as a whole (`too_many_problem`): its keys are kept
# in the round's raw (``declined_keys``), and the retry declines each of them.
TOO_MANY_INPUTS = "too_many_inputs"


# Round kinds whose readiness a service above this one handles (gates: `gate_decisions`), registered when the
# app starts, so that this module never imports upwards.
READY_HANDLERS: dict[str, Callable[..., None]] = {}
# Ends the requests of a round just opened that were made for a person who can no longer open them
# (`Route.gone`), as a person's deletion or deactivation ends those waiting for them: registered by
# `escalation` when the app starts. Called in the round's transaction with the round and {request: why}.
GONE_HANDLERS: list[Callable[..., None]] = []


def round_ttl(call: ToolCall) -> int:
    return (
        call.server.round_ttl if call.server and call.server.round_ttl else None
    ) or settings.ELICIT_ROUND_TTL


def expiry_action(call: ToolCall, rnd: Round | None = None) -> str:
    """The routed policies' choice wins (abandon over cancel), then the server's, then the hub's default."""
    if rnd is not None:
        chosen = {ir.policy.on_expiry for ir in rnd.input_requests.select_related("policy") if ir.policy} - {
            ""
        }
        if chosen:
            return ExpiryAction.ABANDON if ExpiryAction.ABANDON in chosen else ExpiryAction.CANCEL
    server_choice = call.server.on_expiry if call.server and call.server.on_expiry else ""
    return server_choice or settings.ELICIT_EXPIRY_POLICY


def too_many_problem(count: int) -> str:
    """Why a round is refused as a whole (too many input requests in it), or ""."""
    limit = settings.ELICIT_MAX_INPUT_REQUESTS
    if count <= limit:
        return ""
    return f"the server asked for {count} inputs in one round; the hub accepts at most {limit}"


# An elicitation's params are kept and handed on as the server sent them (to reviewers, to an agent that
# answers itself): besides the message and the requestedSchema (bounded by the settings), its url and the
# rest of its params (``_meta``, fields of later revisions) are bounded too.
MAX_URL = 8 * 1024  # characters; what browsers and servers commonly take
MAX_OTHER_PARAMS = 16 * 1024  # bytes of compact JSON
_BOUNDED_PARAMS = frozenset({"message", "requestedSchema", "url"})


def _size_problem(params: dict[str, Any]) -> str:
    """Why one elicitation is too big to show or keep (its message, its requestedSchema, its url or the rest
    of its params), or ""."""
    message = params.get("message")
    if message is not None and not isinstance(message, str):
        return "its message is not text"
    if isinstance(message, str) and len(message) > settings.ELICIT_MAX_MESSAGE:
        return (
            f"its message is {len(message)} characters long; the hub shows at most "
            f"{settings.ELICIT_MAX_MESSAGE}"
        )
    schema = params.get("requestedSchema")
    if schema is not None and (size := safejson.size(schema)) > settings.ELICIT_MAX_SCHEMA:
        return f"its requestedSchema is {size} bytes; the hub accepts at most {settings.ELICIT_MAX_SCHEMA}"
    url = params.get("url")
    if url is not None and not isinstance(url, str):
        return "its url is not text"
    if isinstance(url, str) and len(url) > MAX_URL:
        return f"its url is {len(url)} characters long; the hub accepts at most {MAX_URL}"
    rest = {name: value for name, value in params.items() if name not in _BOUNDED_PARAMS}
    if rest and (size := safejson.size(rest)) > MAX_OTHER_PARAMS:
        return f"its other params are {size} bytes; the hub accepts at most {MAX_OTHER_PARAMS}"
    return ""


def _storage_problem(request: dict[str, Any]) -> str:
    """Why one request cannot be stored as it came (a NUL or a lone surrogate in it, NaN, absurd nesting: what
    makes a 2026-07-28 answer malformed, `wire.read_call_result`), or ""."""
    found = safejson.problem(request, max_depth=MAX_DEPTH)
    return f"it holds {found[0]} at {found[1]}, which the hub cannot store" if found else ""


def _unsupported(ir: InputRequest, problem: str) -> InputRequest:
    ir.problem = f"Not shown to reviewers: {problem.rstrip('.')}. The hub answered decline."
    ir.status = InputRequest.Status.UNSUPPORTED
    ir.action = InputRequest.Action.DECLINE
    return ir


def _describe(key: str, request: dict[str, Any], refused: str = "") -> InputRequest:
    """An unsaved InputRequest for one entry of inputRequests, marked unsupported when it cannot be shown.

    Over a limit (``refused``: the whole round; or this request's own size) it keeps only a bounded part of
    what the server sent: the start of the message, and neither the schema nor the other params."""
    params = request.get("params")
    if not isinstance(params, dict):
        params = {}
    mode = params.get("mode") or "form"
    message = params.get("message")
    ir = InputRequest(
        key=key,
        method=str(request.get("method", ""))[:100],
        mode=mode if mode in InputRequest.Mode.values else InputRequest.Mode.FORM,
        # Not text (a list, an object: `_size_problem`): none kept, whatever its size.
        message=message if isinstance(message, str) else "",
        params=params,
    )
    oversized = refused or _size_problem(params) or _storage_problem(request)
    if oversized:
        ir.method = safejson.storable_text(ir.method)
        ir.message = safejson.storable_text(ir.message[: settings.ELICIT_MAX_MESSAGE])
        ir.params = {"mode": ir.mode}
        ir.requested_schema = {}
        if ir.mode == InputRequest.Mode.URL:
            ir.url = "about:blank"  # none kept (the mode's payload must not be empty)
        return _unsupported(ir, oversized)
    problem = ""
    if ir.method != "elicitation/create":
        problem = f"the hub does not answer {ir.method or 'unnamed'} requests"
        # Nothing of it is shown; the row still needs its mode's payload (a relay may send any request).
        ir.requested_schema = {}
        if ir.mode == InputRequest.Mode.URL:
            ir.url = "about:blank"
    elif mode == "url":
        ir.url = str(params.get("url") or "")
        problem = urlsafety.refusal(params.get("url"))
        if problem and not ir.url:
            ir.url = "about:blank"
    elif mode == "form":
        schema = params.get("requestedSchema")
        problems = schema_forms.check_schema(schema)
        ir.requested_schema = schema if isinstance(schema, dict) else {}
        if isinstance(ir.requested_schema.get("properties"), dict):
            ir.property_order = list(ir.requested_schema["properties"])
        problem = "; ".join(problems)
        if not problem and schema_forms.sensitive_fields(schema):
            ir.flags = ["sensitive_fields"]
    else:
        ir.requested_schema = {}
        problem = f"unknown elicitation mode {mode!r}"
    if problem:
        _unsupported(ir, problem)
    return ir


def _bounded_raw(raw: dict[str, Any], declined_keys: list[str] | None = None) -> dict[str, Any]:
    """The server's answer as kept for the record, or only its size when it is over ELICIT_MAX_RESULT (or
    when it holds what cannot be stored). A round refused as a whole keeps only its size and its keys."""
    size = safejson.size(raw)
    unstorable = safejson.problem(raw, max_depth=MAX_DEPTH)
    if size <= settings.ELICIT_MAX_RESULT and unstorable is None and declined_keys is None:
        return raw
    kept: dict[str, Any] = {"resultType": raw.get("resultType"), "truncated": True, "size": size}
    if unstorable is not None:
        kept["resultType"] = None  # it may be what cannot be stored
        kept["unstorable"] = f"{unstorable[0]} at {unstorable[1]}"
    if declined_keys is not None:
        kept["declined_keys"] = declined_keys
    return kept


_LAST_NUMBER = PreparedRead(
    lambda call: Round.objects.filter(call=call).order_by("-number").values_list("number", flat=True)[:1],
    call=Round._meta.get_field("call"),
)


def last_round_number(call: ToolCall) -> int:
    """The number of the call's latest round (rounds are numbered 1, 2, ... in order), 0 before the first."""
    return _LAST_NUMBER.first(call=call.pk) or 0


def round_open(
    *,
    call: ToolCall,
    input_requests: dict[str, dict[str, Any]],
    raw: dict[str, Any],
    request_state: str | None,
    received_at: datetime,
    ttl: int | None = None,
    kind: str = Round.Kind.RETRY,
    server_deadline: datetime | None = None,
    number: int | None = None,
) -> Round:
    """Park one round. Must run inside the caller's transaction, with the call already claimed.

    `kind` PUSH: the server asked on an open session and waits until `server_deadline` (if known); the answer
    goes back on that session, never by a retry. `number`: the round's number, when the caller has just read
    the last one under the call's lock (else it is read here)."""
    if number is None:
        number = last_round_number(call) + 1
    now = timezone.now()
    refused = too_many_problem(len(input_requests))
    if refused:
        # Refused as a whole: one row says why, not one per request (there may be a hundred thousand).
        key, request = next(iter(input_requests.items()))
        rows = [_describe(key, request, refused)]
        rows[0].flags = [TOO_MANY_INPUTS]
    else:
        rows = [_describe(key, request) for key, request in input_requests.items()]
    routes = route_all(call=call, requests=rows)
    ttls = [r.policy.ttl for r in routes if r.policy and r.policy.ttl]
    # The strictest policy sets the round's clock; a relay's own `ttl` may shorten it, never lengthen it.
    clock = min([ttl, *ttls]) if ttl else min(ttls or [round_ttl(call)])
    rnd = Round.objects.create(
        call=call,
        number=number,
        kind=kind,
        server_deadline=server_deadline,
        raw=_bounded_raw(raw, list(input_requests) if refused else None),
        request_state=request_state,
        opened_at=received_at,
        deadline=received_at + timedelta(seconds=clock),
    )
    gone: dict[InputRequest, str] = {}
    for ir, chosen in zip(rows, routes, strict=True):
        if chosen.gone and ir.status == InputRequest.Status.PENDING:
            gone[ir] = chosen.gone
        ir.round = rnd
        ir.created_at = received_at
        ir.team, ir.policy, ir.rule, ir.assignee = chosen.team, chosen.policy, chosen.rule, chosen.assignee
        ir.routing = chosen.explanation
        ir.for_requester = chosen.for_requester and ir.status == InputRequest.Status.PENDING
        ir.approvals_required = chosen.approvals_required
        ir.flags = [*ir.flags, *chosen.warnings]
        if ir.status != InputRequest.Status.PENDING:
            ir.answered_at = now
    InputRequest.objects.bulk_create(rows)
    opened: dict[str, Any] = {"round": number, "keys": list(input_requests)}
    if refused:
        # One event for the whole refused round, not one per request (there may be thousands).
        limit = settings.ELICIT_MAX_INPUT_REQUESTS
        keys = list(itertools.islice(input_requests, limit))
        opened = {"round": number, "keys": keys, "key_count": len(input_requests)}
        opened["problem"] = rows[0].problem
    opened["has_request_state"] = request_state is not None
    # The round's events join the audit chain together: one lock and one insert for all of them.
    with audit.batched():
        audit.record(actor=SYSTEM, verb="round.opened", call=call, data=opened)
        for ir in rows if not refused else []:
            audit.record(
                actor=SYSTEM,
                verb="input.unsupported" if ir.problem else "input.requested",
                call=call,
                input_request=ir,
                data={
                    "key": ir.key,
                    "mode": ir.mode,
                    "message": ir.message,
                    "problem": ir.problem,
                    "flags": ir.flags,
                    "schema_sha256": schema_forms.fingerprint(ir.requested_schema),
                },
            )
            if not ir.problem:
                routed = {
                    "rule": ir.routing.get("matched"),
                    "team": ir.routing.get("team"),
                    "policy": ir.routing.get("policy"),
                    "assignee": ir.routing.get("assignee"),
                    "approvals_required": ir.approvals_required,
                    "answered_by": "requester" if ir.for_requester else "team",
                }
                if ir.routing.get("passthrough_refused"):
                    routed["passthrough_refused"] = ir.routing["passthrough_refused"]
                audit.record(actor=SYSTEM, verb="input.routed", call=call, input_request=ir, data=routed)
                if not ir.for_requester and ir not in gone:
                    notifications.notify(ir=ir, team=ir.team, event="routed")
    if gone:
        if not GONE_HANDLERS:
            raise RuntimeError("a request's person is gone but no handler is registered (approvals.apps)")
        for handler in GONE_HANDLERS:
            handler(rnd=rnd, gone=gone)
        if rnd.status != Round.Status.OPEN:
            return rnd
    pending = [ir for ir in rows if ir.status == InputRequest.Status.PENDING and ir not in gone]
    if not pending and not gone:
        round_mark_ready(rnd=rnd, outcome=Round.Outcome.ANSWERED)
    else:
        transaction.on_commit(functools.partial(_announce, rnd.pk, call.pk, pending))
    return rnd


def _announce(round_id: int, call_id: Any, pending: list[InputRequest]) -> None:
    """After commit: the round is in the inbox now (or with the agent's client); tell the queues (or the
    gateway request waiting on the call)."""
    queued = [ir for ir in pending if not ir.for_requester]
    if queued:
        # The card goes with the notice: the sockets send it without reading the round again.
        card = cards.prerender(round_id, [str(ir.pk) for ir in queued])
        broadcast.queue_changed("round.opened", call_id, queued, card=card)
    if len(queued) < len(pending):
        call = ToolCall.objects.only("status").filter(pk=call_id).first()
        if call is not None:
            broadcast.call_changed(call, event=broadcast.ASKED)  # the gateway's wait hands them to the agent


def round_mark_ready(*, rnd: Round, outcome: str) -> bool:
    """Every input request has its final answer: hand the round to a worker (a relay: to the agent)."""
    now = timezone.now()
    if not Round.objects.filter(pk=rnd.pk, status=Round.Status.OPEN).update(
        status=Round.Status.READY, answered_at=now, outcome=outcome
    ):
        return False
    rnd.status, rnd.answered_at, rnd.outcome = Round.Status.READY, now, outcome  # the caller reads no row
    call = rnd.call
    audit.record(
        actor=SYSTEM, verb="round.answered", call=call, data={"round": rnd.number, "outcome": outcome}
    )
    if call.kind == ToolCall.Kind.RELAY:
        _relay_deliver(call=call, rnd=rnd, expired=outcome == Round.Outcome.EXPIRED)
        return True
    handler = READY_HANDLERS.get(rnd.kind)
    if handler is not None:
        handler(rnd=rnd, outcome=outcome)
        return True
    if rnd.kind == Round.Kind.GATE:
        raise RuntimeError("a gate round is ready but no gate handler is registered (approvals.apps)")
    if rnd.kind == Round.Kind.PUSH:
        # The holder waiting on the session gives the answer to the server; no retry is queued.
        notify_holders(f"call:{call.pk}")
        return True
    ToolCall.objects.filter(
        pk=call.pk,
        status__in=[ToolCall.Status.AWAITING_INPUT, ToolCall.Status.RUNNING, ToolCall.Status.RESUMING],
    ).update(status=ToolCall.Status.RESUMING, updated_at=now)
    enqueue_on_commit(RUN_CALL, str(call.pk))
    return True


def notify_holders(payload: str = "work") -> None:
    """Wake the holder processes: ``work`` (a call to claim) or ``call:<id>`` (its round has an answer, or
    the call ended: the agent cancelled it).
    PostgreSQL delivers it when the surrounding transaction commits, never on rollback."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [HOLDER_CHANNEL, payload])


def input_responses(rnd: Round) -> dict[str, dict[str, Any]]:
    rows = list(_ANSWERS(round=rnd.pk))
    responses = {ir.key: ir.as_input_response() for ir in rows}
    if any(TOO_MANY_INPUTS in (ir.flags or ()) for ir in rows):
        # A round refused as a whole: every key the server sent is declined.
        for key in (rnd.raw or {}).get("declined_keys") or ():
            responses.setdefault(key, {"action": InputRequest.Action.DECLINE.value})
    return responses


# Every retry reads its round's answers; compiled once per process, reading only what an answer sends.
_ANSWERS = PreparedRead(
    lambda round: InputRequest.objects.filter(round=round).only(
        "id", "key", "action", "mode", "content", "flags"
    ),
    round=InputRequest._meta.get_field("round"),
)


def _relay_deliver(*, call: ToolCall, rnd: Round, expired: bool) -> None:
    now = timezone.now()
    status = ToolCall.Status.EXPIRED if expired else ToolCall.Status.ANSWERED
    responses = input_responses(rnd)
    updated = ToolCall.objects.filter(pk=call.pk, status=ToolCall.Status.AWAITING_INPUT).update(
        status=status, input_responses=responses, finished_at=now, updated_at=now
    )
    Round.objects.filter(pk=rnd.pk).update(status=Round.Status.CLOSED, closed_at=now)
    rnd.status, rnd.closed_at = Round.Status.CLOSED, now
    if not updated:
        return
    call.refresh_from_db()
    audit.record(
        actor=SYSTEM,
        verb="relay.expired" if expired else "relay.answered",
        call=call,
        data={"keys": list(responses), "actions": {k: v["action"] for k, v in responses.items()}},
    )
    webhooks.webhook_queue(call=call, event_type="relay.expired" if expired else "relay.answered")
    transaction.on_commit(lambda: broadcast.call_changed(call))


# Beat's sweep of the secrets a final call no longer needs (`rounds_forget_state`): this many rounds per
# transaction, at most this many transactions per run (the rest waits for the next run).
FORGET_BATCH = 500
FORGET_BATCHES = 20


def rounds_forget_state() -> int:
    """Clear the ``requestState`` of the rounds whose call is final; returns how many were cleared.

    The server's opaque state is echoed on a round's retry and read nowhere else, and a final call is never
    sent again (an unknown outcome is reported, not re-sent): once the call ends the secret serves no one,
    so the hub forgets it rather than keep it for good. A sweep, not a part of the statements that end a
    call, so that no send or answer pays for it; a partial index (``round_request_state_idx``) finds the
    rounds still holding one. Each batch is its own short transaction and skips rows a send or an answer
    holds locked (the next run takes them)."""
    cleared = 0
    for _ in range(FORGET_BATCHES):
        with transaction.atomic():
            batch = list(
                Round.objects.filter(request_state__isnull=False, call__status__in=ToolCall.Status.finals())
                .select_for_update(skip_locked=True, no_key=True, of=("self",))
                .values_list("pk", flat=True)[:FORGET_BATCH]
            )
            if batch:
                cleared += Round.objects.filter(pk__in=batch).update(request_state=None)
        if len(batch) < FORGET_BATCH:
            break
    return cleared
