"""API endpoints: parse, authorise through one helper, call one service, shape with selectors."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode
from uuid import UUID

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.log import log_response
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from ninja import Header, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.errors import Throttled as NinjaThrottled
from ninja.parser import Parser
from pydantic import ValidationError as PydanticValidationError

from approvals import broadcast, outage, permissions, ratelimit, safejson, selectors
from approvals.api.auth import AgentRequest, agent_auth, agent_or_reviewer_auth, reviewer_auth, still_holds
from approvals.api.schemas import (
    MAX_IDEMPOTENCY_KEY,
    AnsweredOut,
    CallIn,
    CallOut,
    Created,
    DecideIn,
    ErrorOut,
    ExtendedOut,
    ExtendIn,
    GrantOut,
    InboxItemOut,
    RelayIn,
    RelayOut,
    RespondIn,
)
from approvals.models import AgentClient, ToolCall
from approvals.prepared import PreparedRead
from approvals.services import answers, calls, extensions, gate_decisions, grants
from approvals.services.errors import Forbidden, Invalid, ServiceError


class NotAnObject(ValueError):
    """A body that is JSON, but not the object every API body is."""


class DuplicateKey(ValueError):
    """An object of the body names one member twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key if len(key) <= 40 else key[:40] + "..."


def _members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members, refusing a name given twice: ``json`` would keep the last silently, losing the
    first, which many other parsers keep (a proxy or filter in front of the hub would judge another call
    than the one the hub makes)."""
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return members


class _NotANumber(float):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a body (not JSON numbers), or a number too large for a
    double (``1e400``, read as infinity), as parsed: kept so that `safejson.check` finds it where it is
    (`on_http_error` names the place), and named as the body wrote it."""

    shown: str

    def __new__(cls, text: str) -> _NotANumber:
        number = super().__new__(cls, text)
        number.shown = text if len(text) <= 40 else text[:40] + "..."
        return number

    def __repr__(self) -> str:
        return self.shown


NOT_A_NUMBER = " is not a JSON number"  # safejson's reason for a value that is not finite


def _not_a_number(name: str) -> Any:
    return _NotANumber(name)


def _a_number(text: str) -> float:
    number = float(text)
    return number if math.isfinite(number) else _NotANumber(text)


class StrictJsonParser(Parser):
    """Every API body goes through one strict parse: no NaN/Infinity, NUL, lone surrogates or deep nesting
    (approvals.safejson), so nothing that PostgreSQL or the audit log would choke on reaches a service.

    UTF-8 only (RFC 8259; a leading byte order mark is ignored): given bytes, ``json.loads`` guesses UTF-16
    and UTF-32 from the first bytes, so a body a proxy or filter in front of the hub reads as UTF-8 (and
    finds nothing in) would be read here as a call. And an object: every body is one, and a list or a bare
    value is named as such, not reported as an object missing all its fields. No object may name a member
    twice (`_members`). Otherwise as `safejson.loads`, with the same checks (`safejson.check`)."""

    def parse_body(self, request: HttpRequest) -> Any:
        depth = settings.ELICIT_MAX_JSON_DEPTH
        text = request.body.decode("utf-8-sig")  # UnicodeDecodeError: a 400 (`on_http_error`)
        try:
            value = json.loads(
                text, object_pairs_hook=_members, parse_constant=_not_a_number, parse_float=_a_number
            )
        except RecursionError:
            raise safejson.Unstorable(f"nesting deeper than {depth} levels") from None
        except ValueError as exc:
            # Valid JSON still: Python reads at most sys.get_int_max_str_digits() digits of an integer.
            if "integer string conversion" not in str(exc):
                raise
            limit = sys.get_int_max_str_digits()
            raise safejson.Unstorable(f"an integer of more than {limit} digits") from None
        safejson.check(value, max_depth=depth)
        if not isinstance(value, dict):
            raise NotAnObject("The request body must be a JSON object.")
        return value


class HubApi(NinjaAPI):
    """The API, whose OpenAPI document is built once per process and path: it follows from the code alone,
    and building it took some 50 ms of CPU on every GET of /api/v1/openapi.json, which anyone may send, with
    no credential and no rate limit."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._documents: dict[str, Any] = {}

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict | None = None) -> Any:
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        document = self._documents.get(path_prefix)
        if document is None:
            document = self._documents[path_prefix] = super().get_openapi_schema(path_prefix=path_prefix)
        return document


def _read_only(view: Any) -> Any:
    """The OpenAPI document's and the docs page's view: GET and HEAD, as every address the API reads; another
    method is a 405 naming them (shaped as the API's errors by approvals.middleware.ErrorShapeMiddleware),
    not the document again. Exempt from the CSRF check as django-ninja's views are: a cookie-less POST gets
    that 405 too, not a 403 about a token it could not have."""
    return csrf_exempt(require_safe(view))


api = HubApi(
    title="Elicit Hub API",
    version="1",
    description="Agents ask the hub to call MCP tools; humans answer the servers' input requests.",
    urls_namespace="api",
    throttle=[ratelimit.TokenRateThrottle(settings.ELICIT_API_RATE)],
    parser=StrictJsonParser(),
    docs_decorator=_read_only,
)
outage.install(api)

ERRORS: dict[int | str, Any] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    405: ErrorOut,  # answered by approvals.middleware.ErrorShapeMiddleware (with Allow); listed for OpenAPI
    409: ErrorOut,
    413: ErrorOut,
    429: ErrorOut,
    500: ErrorOut,
    503: ErrorOut,
}


def error(
    request: HttpRequest, status: int, code: str, message: str, fields: dict | None = None
) -> HttpResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return api.create_response(request, {"error": body}, status=status)


@api.exception_handler(ServiceError)
def on_service_error(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    return error(request, exc.status, exc.code, exc.message, exc.fields)


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    fields = {}
    in_body = False
    for problem in exc.errors:
        loc = list(problem.get("loc", []))
        in_body = in_body or not loc or loc[0] not in ("path", "query")
        location = [str(part) for part in loc if part not in ("body", "payload", "query", "path")]
        fields[".".join(location) or "body"] = str(problem.get("msg", "invalid"))
    message = "The request body is malformed." if in_body else "A parameter of the request is invalid."
    return error(request, 400, "invalid_body", message, fields)


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    message = "A valid bearer token (or a signed-in session) is required."
    response = error(request, 401, "unauthorized", message)
    response["WWW-Authenticate"] = 'Bearer realm="elicit-hub"'  # RFC 9110: a 401 names its scheme
    return response


@api.exception_handler(NinjaThrottled)
def on_throttled(request: HttpRequest, exc: NinjaThrottled) -> HttpResponse:
    response = error(request, 429, "rate_limited", "Too many requests; retry after the time in Retry-After.")
    if exc.wait is not None:
        response["Retry-After"] = str(math.ceil(exc.wait))
    return response


@api.exception_handler(Http404)
def on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error(request, 404, "not_found", "Not found.")


@api.exception_handler(Exception)
def on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A fault no other handler knows (a bug): the API's JSON shape still, with no detail for the caller;
    the traceback goes to the log, as Django's own 500 would (and its signal, which tests' clients read).
    Django's refusals keep their statuses (400 for a suspicious request, 403). A body Django cannot split
    into the multipart form its Content-Type names is the caller's mistake too, a 400: a signed-in
    session's CSRF check reads the form's token from it."""
    if isinstance(exc, SuspiciousOperation):
        return error(request, 400, "invalid_request", "The request was refused as malformed.")
    if isinstance(exc, MultiPartParserError):
        message = "The request body is not the multipart form its Content-Type names; the API takes JSON."
        return error(request, 400, "invalid_body", message)
    if isinstance(exc, PermissionDenied):
        return error(request, 403, "forbidden", "You may not do this.")
    signals.got_request_exception.send(sender=None, request=request)
    response = error(
        request, 500, "internal_error", "The hub failed to handle this request; the fault is logged."
    )
    log_response("Internal Server Error: %s", request.path, response=response, request=request, exception=exc)
    return response


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    cause = exc.__cause__
    if isinstance(cause, safejson.Unstorable):
        where = cause.where.removeprefix("$").removeprefix(".") or "body"
        message = f"The request body holds {cause.reason} at {cause.where}."
        if cause.reason.endswith(NOT_A_NUMBER):
            number = cause.reason.removesuffix(NOT_A_NUMBER)
            if number in ("NaN", "Infinity", "-Infinity"):
                message = f"The request body holds {number} at {cause.where}, which is not a JSON number."
            else:
                message = f"The request body holds {number} at {cause.where}, a number too large to store."
        return error(request, 400, "invalid_body", message, {where: cause.reason})
    if isinstance(cause, DuplicateKey):
        return error(
            request,
            400,
            "invalid_body",
            f"The request body names {cause.key!r} twice in one object; send each member once.",
            {"body": f"{cause.key!r} given twice"},
        )
    if isinstance(cause, NotAnObject):
        return error(request, 400, "invalid_body", str(cause), {"body": "must be a JSON object"})
    if isinstance(cause, ValueError):  # json.JSONDecodeError, UnicodeDecodeError
        return error(request, 400, "invalid_body", "The request body is not valid JSON (UTF-8).")
    code = {400: "invalid_body", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
    return error(request, exc.status_code, code.get(exc.status_code, "error"), str(exc))


def as_built(request: HttpRequest, response: HttpResponse, body: Any) -> HttpResponse:
    """``body`` (built by approvals.selectors, as webhooks send it) as it is, with the headers set on
    ``response``: the operation's response schema describes it in the OpenAPI document, and is not applied to
    it (which would drop the fields a schema does not list, and turn a field left out into a null)."""
    return api.create_response(request, body, temporal_response=response)


# An agent's own call, read for every answer about it (the whole call; while a long-poll waits, its status):
# compiled once per process.
_OWN_FIELDS: dict[str, Any] = {
    "pk": ToolCall._meta.get_field("id"),
    "agent": ToolCall._meta.get_field("agent"),
    "kind": ToolCall._meta.get_field("kind"),
}
_OWN_CALL = PreparedRead(
    lambda pk, agent, kind: selectors.call_alone().filter(pk=pk, agent=agent, kind=kind)[:1],
    **_OWN_FIELDS,
)
_OWN_STATUS = PreparedRead(
    lambda pk, agent, kind: ToolCall.objects.only("id", "status").filter(pk=pk, agent=agent, kind=kind)[:1],
    **_OWN_FIELDS,
)


def _own_call(agent: Any, call_id: UUID, kind: str) -> ToolCall:
    call = _OWN_CALL.first(pk=call_id, agent=agent, kind=kind)
    if call is None:
        raise Http404
    return selectors.with_rounds(call)


def _created(call: ToolCall, base: str) -> Created:
    return Created(id=str(call.pk), status=call.status, url=f"/api/v1/{base}/{call.pk}")


# --- agents ---------------------------------------------------------------------------------------------


KEY_HEADER = Header(
    None,
    alias="Idempotency-Key",
    description=f"The request's idempotency key (at most {MAX_IDEMPOTENCY_KEY} characters), as the body's "
    "`idempotency_key`.",
)


def _idempotency_key(header: str | None, payload: CallIn) -> str | None:
    """The body's ``idempotency_key``, or else the ``Idempotency-Key`` header (as the gateway takes it): a
    client that sends the usual header is not given a second execution for its retry. The body's field, the
    contract's, wins over the header: an HTTP library that adds a header of its own changes nothing."""
    body = payload.idempotency_key or None
    if body is not None:
        return body
    header = (header or "").strip()
    if len(header) > MAX_IDEMPOTENCY_KEY:
        raise Invalid(
            f"The Idempotency-Key header is over {MAX_IDEMPOTENCY_KEY} characters.",
            code="invalid_body",
            fields={"Idempotency-Key": f"at most {MAX_IDEMPOTENCY_KEY} characters"},
        )
    if problem := safejson.text_problem(header):
        raise Invalid(
            f"The Idempotency-Key header holds {problem}.",
            code="invalid_body",
            fields={"Idempotency-Key": "invalid"},
        )
    return header or None


def _located(response: HttpResponse, created: Created, is_new: bool) -> Created:
    """A new call's or relay's address in ``Location`` as well as in the body's ``url`` (RFC 9110)."""
    if is_new:
        response["Location"] = created.url
    return created


@api.post("/calls", auth=agent_auth, response={200: Created, 202: Created, **ERRORS}, tags=["agents"])
def call_create(
    request: AgentRequest,
    response: HttpResponse,
    payload: CallIn,
    idempotency_header: str | None = KEY_HEADER,
) -> Status:
    """Ask the hub to call a tool. The same idempotency_key (or ``Idempotency-Key`` header) from the same
    agent, with the same server, tool and arguments, returns the existing call (200); with another request
    it is refused (409). A new call (202) has its address in ``Location``."""
    call, created = calls.call_submit(
        agent=request.auth,
        server_slug=payload.server,
        tool=payload.tool,
        arguments=payload.arguments,
        idempotency_key=_idempotency_key(idempotency_header, payload),
        callback_url=payload.callback_url or "",
        on_behalf_of=payload.on_behalf_of,
    )
    if not created:
        calls.refuse_other_request(
            call,
            server_slug=payload.server,
            tool=payload.tool,
            arguments=payload.arguments,
            on_behalf_of=payload.on_behalf_of,
        )
    return Status(202 if created else 200, _located(response, _created(call, "calls"), created))


@contextmanager
def _connection_released() -> Iterator[None]:
    """Then the connection goes back to the pool: a long-poll holds none while it waits. Inside an atomic
    block (a caller's transaction) the connection is not ours to give back."""
    try:
        yield
    finally:
        if not connection.in_atomic_block:
            connection.close()


def _own_call_released(agent: Any, call_id: UUID, kind: str) -> ToolCall:
    """`_own_call`, then the connection goes back to the pool."""
    with _connection_released():
        return _own_call(agent, call_id, kind)


def _own_status_released(agent: Any, call_id: UUID, kind: str) -> ToolCall:
    """Only the call's status (one small query), for the checks while a long-poll waits; the connection goes
    back to the pool. A call gone meanwhile reads as final, so the wait ends and the full load answers 404."""
    with _connection_released():
        call = _OWN_STATUS.first(pk=call_id, agent=agent, kind=kind)
    return call if call is not None else ToolCall(pk=call_id, status=ToolCall.Status.CANCELLED)


def _long_poll(request: AgentRequest, call_id: UUID, kind: str, wait: int) -> ToolCall:
    """The agent's call, once it is final or after ``wait`` seconds. Only the wait runs on the event loop;
    the reads run here, on the request's thread, like any sync view's. After a wait the agent's token is
    read again: one revoked meanwhile gets a 401, not the call."""
    agent = request.auth
    wait = max(0, min(wait, settings.ELICIT_LONG_POLL_MAX))
    # The whole call (rounds, requests, gates) is read once, for the answer; waiting reads its status, first
    # once the wait listens for the call's notices (a status read before that would have to be read again).
    if wait:
        status = sync_to_async(_own_status_released)
        async_to_sync(broadcast.wait_until_final)(call_id, wait, lambda: status(agent, call_id, kind))
        if not still_holds(request):
            raise AuthenticationError
    return _own_call_released(agent, call_id, kind)


WAIT = Query(0, description="Seconds (at most 60) to wait for a final status; 0 or less: answer at once.")


@api.get("/calls/{call_id}", auth=agent_auth, response={200: CallOut, **ERRORS}, tags=["agents"])
def call_get(request: AgentRequest, response: HttpResponse, call_id: UUID, wait: int = WAIT) -> HttpResponse:
    """The call. With ``wait`` (seconds, at most 60) it answers once the call is final, or after ``wait``."""
    call = _long_poll(request, call_id, ToolCall.Kind.CALL, wait)
    return as_built(request, response, selectors.call_detail(call))


@api.post("/calls/{call_id}/cancel", auth=agent_auth, response={200: CallOut, **ERRORS}, tags=["agents"])
def call_cancel(request: AgentRequest, response: HttpResponse, call_id: UUID) -> HttpResponse:
    """Give up: pending input requests are cancelled and the call ends ``cancelled``."""
    calls.call_cancel(agent=request.auth, call_id=call_id, kind=ToolCall.Kind.CALL)
    call = _own_call(request.auth, call_id, ToolCall.Kind.CALL)
    return as_built(request, response, selectors.call_detail(call))


@api.post("/relays", auth=agent_auth, response={200: Created, 201: Created, **ERRORS}, tags=["agents"])
def relay_create(
    request: AgentRequest,
    response: HttpResponse,
    payload: RelayIn,
    idempotency_header: str | None = KEY_HEADER,
) -> Status:
    """Hand over input requests the agent received itself; the hub collects the answers for it. A new relay
    (201) has its address in ``Location``; an idempotency key (or header) repeats it as for a call."""
    call, created = calls.relay_submit(
        agent=request.auth,
        server_slug=payload.server,
        tool=payload.tool,
        arguments=payload.arguments,
        input_requests=payload.input_requests,
        idempotency_key=_idempotency_key(idempotency_header, payload),
        callback_url=payload.callback_url or "",
        expires_in=payload.expires_in,
        on_behalf_of=payload.on_behalf_of,
    )
    if not created:
        calls.refuse_other_request(
            call,
            server_slug=payload.server,
            tool=payload.tool,
            arguments=payload.arguments,
            input_requests=payload.input_requests,
            on_behalf_of=payload.on_behalf_of,
        )
    return Status(201 if created else 200, _located(response, _created(call, "relays"), created))


@api.get("/relays/{relay_id}", auth=agent_auth, response={200: RelayOut, **ERRORS}, tags=["agents"])
def relay_get(
    request: AgentRequest, response: HttpResponse, relay_id: UUID, wait: int = WAIT
) -> HttpResponse:
    """The relay; ``input_responses`` is null until every request is answered (or the relay expired)."""
    call = _long_poll(request, relay_id, ToolCall.Kind.RELAY, wait)
    return as_built(request, response, selectors.relay_detail(call))


@api.post("/relays/{relay_id}/cancel", auth=agent_auth, response={200: RelayOut, **ERRORS}, tags=["agents"])
def relay_cancel(request: AgentRequest, response: HttpResponse, relay_id: UUID) -> HttpResponse:
    """Give up: pending input requests are cancelled and the relay ends ``cancelled``."""
    calls.call_cancel(agent=request.auth, call_id=relay_id, kind=ToolCall.Kind.RELAY)
    call = _own_call(request.auth, relay_id, ToolCall.Kind.RELAY)
    return as_built(request, response, selectors.relay_detail(call))


# --- reviewers ------------------------------------------------------------------------------------------


def _answered(ir: Any) -> dict[str, Any]:
    """The answer to respond and decide: the request as it now stands. One approval of several needed
    leaves it ``pending``, with no action yet (null, as in the call's JSON)."""
    return {"id": str(ir.pk), "status": ir.status, "action": ir.action or None}


@dataclass
class _InboxRead:
    groups: list[str]
    version: str | None
    items: list[dict] | None = None  # None: unchanged since the version the caller waits on
    next_cursor: str | None = None


def _queue_groups(teams: list[tuple[int, str]]) -> list[str]:
    """The groups of the queues behind an inbox of these teams: theirs, and the unrouted queue."""
    return [*(broadcast.team_group(slug) for _, slug in teams), broadcast.team_group(None)]


def _scope_moved(request: HttpRequest, groups: list[str]) -> bool:
    """Someone's teams or sign-in changed while a long-poll waits (the scopes' counter moved): whether it
    changed this inbox: the credential no longer holds (answered 401 after the wait), or the reviewer's teams,
    so their queues, are others (and so the version)."""
    with _connection_released():
        if not still_holds(request):
            return True
        permissions.forget_teams(request.user)
        return _queue_groups(selectors.inbox_teams(request.user)) != groups


def _page_moved(request: HttpRequest, size: int, cursor: str | None, unchanged: str) -> bool:
    """While Redis is unreachable, a long-poll's look at its page: whether it differs from ``unchanged``."""
    permissions.forget_teams(request.user)  # a membership may have gone meanwhile
    return _inbox_read(request.user, size, cursor, unchanged).items is not None


def _bad_cursor() -> Invalid:
    return Invalid(
        "This cursor is not one the inbox gave.", code="invalid_cursor", fields={"cursor": "invalid"}
    )


def _inbox_read(user: Any, size: int, cursor: str | None, unchanged: str | None) -> _InboxRead:
    """The inbox's queues, their version, and (unless the version is still ``unchanged``) one page as JSON
    items; then the connection goes back to the pool, as a long-poll's does."""
    with _connection_released():
        teams = selectors.inbox_teams(user)  # read once: for the queues' version and for the page
        groups = _queue_groups(teams)
        # Read before the page, so a change made while the page is read shows as a new version next time.
        read = _InboxRead(groups, broadcast.queue_version(groups))
        if unchanged is not None and read.version == unchanged:
            return read
        try:
            page, read.next_cursor = selectors.inbox_page(
                user, limit=size, cursor=cursor, team_ids=[pk for pk, _ in teams]
            )
        except selectors.BadCursor:
            raise _bad_cursor() from None
        read.items = [selectors.inbox_item(ir) for ir in page]
        if read.version is None:
            # The queues' counters are in Redis, unreachable now: the version is the page's own, so a
            # long-poll still waits (and reads the page again every second) instead of answering at once
            # to a bot that asks again at once.
            read.version = _page_version(read.items, read.next_cursor)
            if read.version == unchanged:
                read.items = None
        return read


# The prefix of a version read from the page itself (a Redis one is hex digits only).
PAGE_VERSION = "p"


def _page_version(items: list[dict], next_cursor: str | None) -> str:
    """A version of what one inbox page shows: its items and where the next page starts."""
    page = json.dumps([items, next_cursor], sort_keys=True, separators=(",", ":")).encode()
    return PAGE_VERSION + hashlib.blake2b(page, digest_size=12).hexdigest()


@api.get("/inbox", auth=reviewer_auth, response={200: list[InboxItemOut], **ERRORS}, tags=["reviewers"])
def inbox(
    request: HttpRequest,
    response: HttpResponse,
    limit: int | None = Query(None, ge=1, description="At most this many items (capped by the hub)."),
    cursor: str | None = Query(None, max_length=2000, description="From the previous page's Next-Cursor."),
    wait: int = Query(0, ge=0, description="With `version`: seconds to wait for a change (at most 60)."),
    version: str | None = Query(None, max_length=64, description="The Inbox-Version of an earlier answer."),
) -> HttpResponse:
    """Pending input requests this user may answer, oldest first, a page at a time.

    A page holds at most ``limit`` items (and never more than the hub's cap, ELICIT_INBOX_MAX). When more
    exist, the response carries ``Inbox-More: true``, ``Next-Cursor`` and a ``Link`` with ``rel="next"``;
    pass the cursor back to get the next page.

    Every answer carries ``Inbox-Version``, which changes whenever the queues behind this inbox change.
    Long-poll with ``version=<the last Inbox-Version>&wait=<seconds>``: the answer comes as soon as the
    version differs (at once if it already does), or after ``wait`` seconds with the inbox as it is."""
    size = min(limit or settings.ELICIT_INBOX_MAX, settings.ELICIT_INBOX_MAX)
    wait = min(wait, settings.ELICIT_LONG_POLL_MAX)  # at least 0: the query checks it
    if cursor is not None:
        try:  # before any wait: a long-poll with a cursor the inbox never gave would wait, then refuse it
            selectors.check_cursor(cursor)
        except selectors.BadCursor:
            raise _bad_cursor() from None
    # The version covers the reviewer's teams too, and a change of teams sends no notice to their queues:
    # a wait watches the scopes' counter (moved by any membership, user or sign-out change), read before the
    # teams are, and looks again at this reviewer's teams and credential when it moves.
    scopes = broadcast.scopes_version() if wait and version is not None else None
    read = _inbox_read(request.user, size, cursor, version if wait else None)
    if read.items is None:
        groups, unchanged = read.groups, read.version
        look_again = sync_to_async(_scope_moved)
        page_moved = sync_to_async(_page_moved)

        async def changed() -> bool:
            nonlocal scopes
            now = await broadcast.aqueue_version(groups)
            if now is None and unchanged is not None and unchanged.startswith(PAGE_VERSION):
                return await page_moved(request, size, cursor, unchanged)  # Redis still down: the page again
            if now != unchanged:
                return True
            try:
                seen = await broadcast.ascopes_version()
            except Exception:  # Redis unreachable: the queues' version alone, as it is read
                return False
            moved, scopes = scopes is not None and seen != scopes, seen
            return moved and await look_again(request, groups)

        # Only the wait runs on the event loop (the request's thread waits for it, as it would for an async
        # view); the reads run on the request's thread.
        async_to_sync(broadcast.wait_until)(groups, wait, changed)
        permissions.forget_teams(request.user)  # a membership may have gone during the wait
        if not still_holds(request):  # nor the token, the user or the session
            raise AuthenticationError
        read = _inbox_read(request.user, size, cursor, None)
    if read.version is not None:
        response["Inbox-Version"] = read.version
    response["Inbox-More"] = "true" if read.next_cursor else "false"
    if read.next_cursor:
        response["Next-Cursor"] = read.next_cursor
        response["Link"] = (
            f'</api/v1/inbox?{urlencode({"limit": size, "cursor": read.next_cursor})}>; rel="next"'
        )
    return as_built(request, response, read.items or [])


@api.post(
    "/input-requests/{request_id}/respond",
    auth=reviewer_auth,
    response={200: AnsweredOut, 422: ErrorOut, **ERRORS},
    tags=["reviewers"],
)
def respond(
    request: HttpRequest, response: HttpResponse, request_id: UUID, payload: RespondIn
) -> HttpResponse:
    """Answer one input request: accept with content, decline with an optional reason, or cancel."""
    ir = answers.input_respond(
        input_request_id=request_id,
        user=request.user,
        action=payload.action,
        content=payload.content,
        reason=payload.reason,
    )
    return as_built(request, response, _answered(ir))


@api.post(
    "/input-requests/{request_id}/decide",
    auth=reviewer_auth,
    response={200: AnsweredOut, 422: ErrorOut, **ERRORS},
    tags=["reviewers"],
)
def decide(request: HttpRequest, response: HttpResponse, request_id: UUID, payload: DecideIn) -> HttpResponse:
    """Decide a gate (an inbox item with ``gate``): ``approve`` the call as asked, ``edit`` it (approve the
    given ``arguments`` instead; checked against the tool's inputSchema), or ``decline`` it with a
    ``reason`` the agent reads. Team, N-of-M and self-approval rules apply as for any input request."""
    ir = gate_decisions.gate_decide(
        input_request_id=request_id,
        user=request.user,
        decision=payload.decision,
        arguments=payload.arguments,
        reason=payload.reason,
        grant=payload.grant,
    )
    return as_built(request, response, _answered(ir))


SchemaT = TypeVar("SchemaT", bound=Schema)

# What an HTTP library sends for a POST given no data (Django's test client, ``curl -d ''``), and a browser's
# form (with its CSRF token) posting to a reviewer's endpoint in its session.
_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


def _a_form(request: HttpRequest) -> bool:
    """Whether the body is the form its Content-Type names. ``curl -d '{"seen": ...}'`` sends JSON under the
    urlencoded form's type: read as a form, it is one field named after the whole JSON text, no ``seen``,
    and the extension it meant to make once would be made again. A form's encoder escapes ``{`` and ``[``
    (``%7B``, ``%5B``), so a body starting with either is JSON, read as the other endpoints read any body."""
    if request.content_type not in _FORMS:
        return False
    if request.content_type == "multipart/form-data":
        return True
    return request.body.lstrip()[:1] not in (b"{", b"[")


def _optional_body(request: HttpRequest, schema: type[SchemaT]) -> SchemaT | None:
    """The body of an endpoint that takes one optionally, checked against ``schema``: None when there is none,
    as such requests were sent before the endpoint read a body (nothing, white space, or a form without the
    schema's fields: a form's fields are read as the page's form posts them, other fields ignored as a JSON
    body's are). Any other body is a JSON object, parsed as every body is (`StrictJsonParser`), with the same
    400s."""
    if _a_form(request):
        given = {name: request.POST.getlist(name) for name in schema.model_fields if name in request.POST}
        if twice := next((name for name, values in given.items() if len(values) > 1), None):
            # As in a JSON body: which of the two would a proxy or filter in front of the hub have read?
            raise HttpError(400, "Cannot parse request body") from DuplicateKey(twice)
        if not given:
            return None
        data: Any = {name: values[0] for name, values in given.items()}
    elif not request.body.strip():
        return None
    else:
        try:
            data = api.parser.parse_body(request)
        except Exception as exc:  # mapped by on_http_error, as ninja maps a declared body's
            raise HttpError(400, "Cannot parse request body") from exc
    try:
        return schema.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationError(
            [{**problem, "loc": ("body", *problem["loc"])} for problem in exc.errors(include_url=False)]
        ) from None


def _body_document(schema: type[Schema]) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of an optional body read by `_optional_body`."""
    document = schema.model_json_schema()
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": document}}}}


@api.post(
    "/input-requests/{request_id}/extend",
    auth=reviewer_auth,
    response={200: ExtendedOut, **ERRORS},
    tags=["reviewers"],
    openapi_extra=_body_document(ExtendIn),
)
def extend(request: HttpRequest, response: HttpResponse, request_id: UUID) -> HttpResponse:
    """Extend the deadline of the round holding a pending input request, where its policy allows it
    (``extend_by``, at most ``max_extensions`` times; never past the server's own deadline).

    Optionally with a JSON body ``{"seen": "<the deadline as last read>"}``: two clients (or a retry) that
    both saw the same deadline extend it once; the other gets 409 ``already_extended``. Without a body, each
    request extends."""
    payload = _optional_body(request, ExtendIn)
    seen = payload.seen if payload is not None else None
    rnd = extensions.round_extend(input_request_id=request_id, user=request.user, seen=seen)
    return as_built(request, response, {"id": str(request_id), "deadline": rnd.deadline.isoformat()})


# --- grants (agents see their own; reviewers their teams') ------------------------------------------------

GRANTS_MAX = 500


@api.get("/grants", auth=agent_or_reviewer_auth, response={200: list[GrantOut], **ERRORS}, tags=["grants"])
def grant_list(
    request: HttpRequest,
    response: HttpResponse,
    # Any other state, however long, is the documented 400 invalid_query (checked below).
    state: str = Query("", description="active, expired or revoked; empty: all."),
    team: str = Query("", max_length=50, description="A team's slug."),
    agent: str = Query("", max_length=120, description="An agent's name (reviewers only)."),
    tool: str = Query("", max_length=200, description="A tool name."),
    limit: int = Query(
        100, ge=1, le=GRANTS_MAX, description=f"At most this many, newest first (<= {GRANTS_MAX})."
    ),
) -> HttpResponse:
    """Remembered grants, newest first: an agent sees its own, a person the grants of their teams.
    ``Grants-More: true`` says that more exist than ``limit``."""
    if state and state not in grants.STATES:
        raise Invalid(
            "state must be active, expired or revoked.", code="invalid_query", fields={"state": "invalid"}
        )
    for name, value in (("team", team), ("agent", agent), ("tool", tool)):
        if safejson.text_problem(value):
            raise Invalid(
                f"{name} holds {safejson.text_problem(value)}.",
                code="invalid_query",
                fields={name: "invalid"},
            )
    filters = grants.Filters(state=state, team=team, agent=agent, tool=tool)
    who = request.auth  # type: ignore[attr-defined]
    if isinstance(who, AgentClient):
        found = grants.listing(agent=who, filters=filters)
    else:
        found = grants.listing(user=request.user, filters=filters)
    page = list(found[: limit + 1])
    response["Grants-More"] = "true" if len(page) > limit else "false"
    return as_built(request, response, [selectors.grant_item(grant) for grant in page[:limit]])


@api.post(
    "/grants/{grant_id}/revoke",
    auth=agent_or_reviewer_auth,
    response={200: GrantOut, **ERRORS},
    tags=["grants"],
)
def grant_revoke(request: HttpRequest, response: HttpResponse, grant_id: UUID) -> HttpResponse:
    """Revoke a grant (a reviewer of its team): the next call it would have let through stops at its gate.
    A refused revoke is recorded (``grant.refused``)."""
    who = request.auth  # type: ignore[attr-defined]
    if isinstance(who, AgentClient):
        grants.refuse_by_id(grant_id, by=who, code="forbidden")
        raise Forbidden("An agent cannot revoke grants; a reviewer of the grant's team can.")
    grant = grants.for_revoke(grant_id=grant_id, user=request.user)
    if grant is None:
        raise Http404
    return as_built(request, response, selectors.grant_item(grants.revoke(grant=grant, by=request.user)))
