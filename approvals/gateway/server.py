"""The hub as an MCP server: `/mcp` (every server the agent may use) and `/mcp/<server-slug>` (one).

Streamable HTTP on the SDK's server side: one `StreamableHTTPSessionManager` serves handshake-era clients
(2025-06-18, 2025-11-25: an `initialize`, then a session named by `Mcp-Session-Id`, held in this process)
and 2026-07-28 clients (one self-contained POST per request); it routes by the `MCP-Protocol-Version`
header. Agents authenticate with the REST API's bearer tokens; a handshake-era session stays bound to the
agent that opened it. `tools/list` answers in pages of ELICIT_GATEWAY_PAGE_SIZE tools; each page but the last
ends in a cursor signed for the agent and the endpoint (`approvals.gateway.paging`). When the tools an agent
sees change, its clients are told (`notifications/tools/list_changed`: on a handshake-era session's GET
stream, on a 2026-07-28 `subscriptions/listen` stream; `approvals.gateway.changes`).

`tools/call` goes through `services.calls.call_submit`, the function behind `POST /api/v1/calls`, so routing,
policies, audit, webhooks and the dashboard see a gateway call as they see any other (its audit records
`"channel": "mcp"`). The request then stays open until the call is final; when the client sent a
`progressToken`, a progress notification says every few seconds what the call waits for. An agent that
disconnects stops waiting; the call goes on, and the same request repeated (same tool, same arguments, no
`Idempotency-Key`) while it is open or up to ELICIT_GATEWAY_REPEAT_WINDOW seconds after it ended gets that
call again instead of a second execution. An `Idempotency-Key` header is the call's idempotency key.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

import anyio
import mcp_types as types
import mcp_types.methods as mcp_methods
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http import (
    MCP_PROTOCOL_VERSION_HEADER,
    MCP_SESSION_ID_HEADER,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_NAME_HEADER, decode_header_value
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from approvals import broadcast, outage, safejson
from approvals.gateway import catalog, changes, paging, passthrough
from approvals.gateway.catalog import SCOPE_KEY
from approvals.gateway.names import shown
from approvals.middleware import too_large_error
from approvals.models import AgentClient, ToolCall
from approvals.ratelimit import AnonymousRateThrottle, TokenRateThrottle
from approvals.services import calls, tokens
from approvals.services.errors import ServiceError
from elicit_hub import door

logger = logging.getLogger(__name__)

CALL_META_KEY = "elicit-hub/call"  # the hub's call id and status, in every tools/call result's _meta
MAX_IDEMPOTENCY_KEY = 200  # ToolCall.idempotency_key's length
# The protocol versions the gateway serves, newest first: 2026-07-28 per request, and every handshake-era
# version the session manager negotiates in an `initialize` (one it does not know gets the latest of them).
SERVED_VERSIONS = [*reversed(MODERN_PROTOCOL_VERSIONS), *reversed(HANDSHAKE_PROTOCOL_VERSIONS)]

# The tool a 2026-07-28 tools/call names, as the guard found it: (name, its input schema as tools/list shows
# it to this client, or None). The SDK's Mcp-Param-* check reads it (`_input_schema`) before dispatch.
_CALLED: ContextVar[tuple[str, Mapping[str, Any] | None] | None] = ContextVar("gateway_called", default=None)

T = TypeVar("T")


async def _db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run an ORM function in a worker thread; its connection goes back to the pool at once, so a call
    waiting for reviewers holds none."""

    def run() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return await sync_to_async(run, thread_sensitive=False)()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _anonymous_wait(client: str, forwarded_for: str | None) -> float | None:
    """Count a request without a valid agent token on the REST API's limiter for anonymous requests (per
    client address, ELICIT_API_ANON_RATE): None while under the limit, else the seconds to wait."""
    request = HttpRequest()
    request.META["REMOTE_ADDR"] = client
    if forwarded_for:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded_for
    throttle = AnonymousRateThrottle(settings.ELICIT_API_ANON_RATE)
    try:
        if throttle.allow_request(request):
            return None
    except Exception:  # the limiter's store (Redis) is down: the request still gets its 401
        logger.warning("gateway: the anonymous request limiter is unavailable")
        return None
    return max(1.0, throttle.wait() or 1.0)


def _agent_of(token: str) -> AgentClient | None:
    found = tokens.authenticate(token)
    return found if isinstance(found, AgentClient) else None


def _agent_and_wait(token: str) -> tuple[AgentClient | None, float | None]:
    """The agent the token names, and its request counted on the REST API's per-token limiter
    (ELICIT_API_RATE), keyed as the API keys it: the same counters, so the API and the gateway share one
    budget per agent. The wait is None while under the limit, else the seconds to wait. One thread hop for
    both: the limiter's store (Redis, or this process's memory while Redis is away) is synchronous."""
    agent = _agent_of(token)
    if agent is None:
        return None, None
    request = HttpRequest()
    request.auth = agent  # type: ignore[attr-defined]  # what django-ninja sets, which the key is made of
    throttle = TokenRateThrottle(settings.ELICIT_API_RATE)
    if throttle.allow_request(request):
        return agent, None
    return agent, max(1.0, throttle.wait() or 1.0)


def agent_sessions() -> int:
    """The handshake-era sessions one agent may hold open in a gateway process at once:
    ELICIT_GATEWAY_AGENT_SESSIONS, by default a tenth of ELICIT_GATEWAY_MAX_SESSIONS (at least one)."""
    configured = settings.ELICIT_GATEWAY_AGENT_SESSIONS
    if configured:
        return max(1, int(configured))
    return max(1, int(settings.ELICIT_GATEWAY_MAX_SESSIONS) // 10)


def _rate_limited(wait: float) -> Response:
    return _error(
        429,
        "rate_limited",
        "Too many requests; retry after the time in Retry-After.",
        {"Retry-After": str(math.ceil(wait))},
    )


def _unavailable(exc: Exception) -> Response:
    """An engine the guard needs is down (PostgreSQL, for the agent's token; Redis, for a request that may
    queue work): the REST API's 503, with its Retry-After, instead of the server's bare 500."""
    engine = outage.engine_of(exc) or "postgresql"
    logger.warning("gateway: %s unavailable (%s)", engine, type(exc).__name__)
    return JSONResponse(
        outage.error_body(engine), status_code=503, headers={"Retry-After": str(outage.RETRY_AFTER)}
    )


class Guard:
    """Every request to `/mcp` or `/mcp/<slug>`: an agent's bearer token, the agent's rate limit (the REST
    API's, on its counters), and (under a slug) a server that agent may use, before the MCP session manager
    sees it."""

    def __init__(
        self,
        app: StreamableHTTPASGIApp,
        manager: StreamableHTTPSessionManager | None = None,
        in_flight: InFlight | None = None,
    ) -> None:
        self.app = app
        self.manager = manager
        self.in_flight = in_flight or InFlight()
        self._opening: dict[int, int] = {}  # per agent: its `initialize` requests in the session manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            refusal = await self._refusal(scope)
        except Exception as exc:
            # An engine down, or one that answers but refuses writes (a Redis out of memory or MISCONF, a
            # read-only PostgreSQL): the 503. Anything else is the server's fault, and raised.
            if outage.engine_of(exc) is None:
                raise
            refusal = _unavailable(exc)
        if refusal is None and scope.get("method") != "POST":
            refusal = _not_modern(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        message: Any = None  # a POST's JSON-RPC message
        if scope.get("method") == "POST":
            body = await door.read_body(
                scope, receive, settings.ELICIT_MAX_BODY, settings.ELICIT_CLIENT_TIMEOUT
            )
            if body is None:  # the client left before its body was in: nobody to answer
                return
            if body is door.TOO_SLOW:  # a body that stopped coming holds the connection no longer
                wait = settings.ELICIT_CLIENT_TIMEOUT
                said = f"The request's body stopped arriving: nothing for {wait:g} seconds. Nothing was done."
                too_slow = {"error": {"code": "request_timeout", "message": said}}
                await JSONResponse(too_slow, status_code=408, headers={"Connection": "close"})(
                    scope, receive, send
                )
                return
            if not isinstance(body, bytes):  # the REST API's JSON 413 (the SDK's own is a line of plain text)
                too_large = too_large_error(settings.ELICIT_MAX_BODY)
                await JSONResponse(too_large, status_code=413, headers={"Connection": "close"})(
                    scope, receive, send
                )
                return
            message = _parsed(body)
            malformed = (
                _unacceptable(scope, message)
                or _malformed(message)
                or _unsupported_version(scope, message)
                or self._over_sessions(scope, message)
            )
            if malformed is not None:
                await malformed(scope, receive, send)
                return
            receive = door.replay(body, receive)
        agent_id = scope[SCOPE_KEY]["agent"]
        request_key = None
        if isinstance(message, dict) and _valid_id(message.get("id")) and "method" in message:
            request_key = _session_request(Request(scope), agent_id, message["id"])
        if request_key is not None and self.in_flight.busy(request_key):
            await _duplicate_id(message["id"])(scope, receive, send)
            return
        opening = self._opens_session(scope, message)
        if opening:  # counted until the manager has admitted (or discarded) its session
            self._opening[agent_id] = self._opening.get(agent_id, 0) + 1
        if request_key is not None:  # until its answer is sent, or its handler ends if that is later
            self.in_flight.enter(request_key)
        called = scope[SCOPE_KEY].get("called")
        token = _CALLED.set(None if called is None else (called[0], called[2]))
        try:
            await self.app(scope, receive, send)
        finally:
            _CALLED.reset(token)
            if request_key is not None:
                self.in_flight.leave(request_key)
            if opening:
                self._opening[agent_id] -= 1
                if not self._opening[agent_id]:
                    del self._opening[agent_id]

    def _opens_session(self, scope: Scope, message: Any) -> bool:
        """Whether the request is a handshake-era `initialize`, which the session manager opens a session
        for (a request of an open session names it; a 2026-07-28 one opens none)."""
        if self.manager is None or not isinstance(message, dict) or message.get("method") != "initialize":
            return False
        headers = Request(scope).headers
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        return headers.get(MCP_SESSION_ID_HEADER) is None and (
            version is None or version in HANDSHAKE_PROTOCOL_VERSIONS
        )

    def _over_sessions(self, scope: Scope, message: Any) -> Response | None:
        """The answer to a handshake-era `initialize` from an agent that already holds its share of this
        process's sessions (`agent_sessions`), else None. The session manager's own limit is one for all
        agents: without a share, one agent whose client opens a session per task and never ends it (or one
        that means harm) fills it, and every other agent's handshake-era client is refused until they
        expire (ELICIT_GATEWAY_SESSION_IDLE, half an hour)."""
        if not self._opens_session(scope, message):
            return None
        agent_id = scope[SCOPE_KEY]["agent"]
        owners: Mapping[str, Any] = getattr(self.manager, "_session_owners", {})
        held = sum(1 for found in list(owners.values()) if found.get("client_id") == f"agent:{agent_id}")
        held += self._opening.get(agent_id, 0)  # its initialize requests still being answered
        share = agent_sessions()
        if held < share:
            return None
        return _error(
            429,
            "too_many_sessions",
            f"This agent holds {held} open MCP sessions, the most one agent may: end one (DELETE /mcp with "
            f"its Mcp-Session-Id) or reuse it; an idle session ends after "
            f"{settings.ELICIT_GATEWAY_SESSION_IDLE} s.",
        )

    async def _refusal(self, scope: Scope) -> Response | None:
        """The answer to a request the guard turns away, or None for one it lets through (`scope` then
        names its agent)."""
        request = Request(scope)
        token = (tokens.bearer(request.headers.get("authorization", "")) or "").strip()
        agent: AgentClient | None = None
        wait: float | None = None
        if token:
            agent, wait = await _db(_agent_and_wait, token)
        if agent is None:
            client = scope.get("client") or ("", 0)
            # Every X-Forwarded-For line, joined as Django joins them: a proxy adds its own line after the
            # client's (HAProxy's forwardfor), and the first alone may be the client's forgery.
            forwarded = ",".join(request.headers.getlist("x-forwarded-for")) or None
            wait = await _db(_anonymous_wait, client[0], forwarded)
            if wait is not None:
                return _rate_limited(wait)
            return _error(
                401,
                "unauthorized",
                "An agent's bearer token is required (Authorization: Bearer eha_...).",
                {"WWW-Authenticate": 'Bearer realm="elicit-hub"'},
            )
        if wait is not None:  # past ELICIT_API_RATE: refused before the slug, as the API throttles first
            return _rate_limited(wait)
        slug = scope.get("path_params", {}).get("slug")
        if slug is not None and not await _db(catalog.may_use, agent.pk, slug):
            # The same answer whether the server does not exist or the agent may not use it.
            return _error(404, "unknown_server", f"This agent has no MCP server {shown(slug)!r}.")
        if (
            request.method == "POST"
            and not await sync_to_async(outage.redis_answers, thread_sensitive=False)()
        ):
            # As the REST API refuses a write (approvals.outage): a tools/call's send is queued through Redis,
            # so one accepted now would be stored with no send queued and its agent left waiting on it.
            raise outage.EngineUnavailable("redis")
        scope[SCOPE_KEY] = {
            "agent": agent.pk,
            "slug": slug,
            "called": await _called(request, agent.pk, slug),
            "token_hash": agent.token_hash,  # to tell a listening client's revoked agent (`changes`)
        }
        # The session manager binds a handshake-era session to this principal: another agent presenting
        # the session's id gets 404. Only the agent's id is kept, never its token.
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=f"agent:{agent.pk}", scopes=[]))
        return None


RequestKey = tuple[int, str, Any]  # (agent, handshake-era session, request id as the SDK correlates it)


def _session_request(request: Request, agent_id: int, request_id: Any) -> RequestKey | None:
    """The key of a request on a handshake-era session, None for any other. The id as the SDK correlates it
    (`coerce_request_id`: 7 and "7" are one id), and the agent in the key, so that another agent's request
    naming the session is refused by the session manager as before."""
    session_id = request.headers.get(MCP_SESSION_ID_HEADER)
    version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if session_id is None or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
        return None  # no session, or a 2026-07-28 request: each POST is its own
    return agent_id, session_id, coerce_request_id(request_id)


class InFlight:
    """The requests of handshake-era sessions still being answered in this process: counted from the guard
    (until the request's HTTP exchange ends) and from the server (until its handler ends, which for a
    tools/call whose client went away is when the call is final). The session's transport and dispatcher
    keep one stream per request id, so a second request with the id of one in flight would take its
    stream: one tool's result would answer another request, or no one."""

    def __init__(self) -> None:
        self._counts: dict[RequestKey, int] = {}

    def busy(self, key: RequestKey) -> bool:
        return key in self._counts

    def enter(self, key: RequestKey) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def leave(self, key: RequestKey) -> None:
        left = self._counts.get(key, 0) - 1
        if left > 0:
            self._counts[key] = left
        else:
            self._counts.pop(key, None)


def request_ids(in_flight: InFlight) -> ServerMiddleware[Any]:
    """A server middleware that counts each handshake-era request on ``in_flight`` while its handler runs,
    which outlasts its HTTP exchange when the client goes away (the call goes on, and its answer is still
    sent to that request's id)."""

    async def counting(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        request, request_id = ctx.request, ctx.request_id
        key = None
        if (
            isinstance(request, Request)
            and request_id is not None
            and SCOPE_KEY in request.scope
            and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        ):
            key = _session_request(request, request.scope[SCOPE_KEY]["agent"], request_id)
        if key is None:
            return await call_next(ctx)
        in_flight.enter(key)
        try:
            return await call_next(ctx)
        finally:
            in_flight.leave(key)

    return counting


def _duplicate_id(request_id: Any) -> Response:
    """-32600 for a request whose id is that of a request of the same session still being answered. The
    session's transport and dispatcher keep one stream per id: passed on, the new request would take the
    first one's stream, and the first one's answer (a tool's result) would reach the new request or no one.
    The error names no id: a client matching it by id would take it for the first request's answer."""
    return _rpc_error(
        types.INVALID_REQUEST,
        f"The request id {shown(str(request_id))!r} is that of a request of this session still being "
        "answered: send each request with an id of its own. The first request goes on.",
    )


def _rpc_error(
    code: int, message: str, request_id: Any = None, status: int = 400, headers: dict[str, str] | None = None
) -> Response:
    return JSONResponse(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}},
        status_code=status,
        headers=headers,
    )


def _valid_id(value: Any) -> bool:
    """MCP's request id: a string or an integer (JSON-RPC's null, fractions and booleans are not ids)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


_UNREADABLE = object()  # a body that is not JSON (or nested past the parser's depth): the SDK answers it


def _parsed(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return _UNREADABLE


def _unacceptable(scope: Scope, message: Any) -> Response | None:
    """The JSON-RPC error for a POST whose headers the transport refuses, in every era alike: a body not sent
    as `application/json` (400), or a client that does not accept both `application/json` and
    `text/event-stream`, either of which the answer may be (406). The transport's own answers are a line of
    plain text or an empty body, which a client cannot read as JSON-RPC. None for a request it takes."""
    request = Request(scope)
    request_id = message.get("id") if isinstance(message, dict) and _valid_id(message.get("id")) else None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        return _rpc_error(
            types.INVALID_REQUEST,
            "The body must be JSON, sent as Content-Type: application/json.",
            request_id,
        )
    has_json, has_sse = check_accept_headers(request)
    if not (has_json and has_sse):
        return _rpc_error(
            types.INVALID_REQUEST,
            "The client must accept both application/json and text/event-stream "
            "(Accept: application/json, text/event-stream).",
            request_id,
            status=406,
        )
    return None


def _not_modern(scope: Scope) -> Response | None:
    """405 (`Allow: POST`) as a JSON-RPC error for a GET or DELETE sent as a 2026-07-28 request, which has
    no session and no stream of its own to open (the transport answers it with an empty body); None for
    any other (a handshake-era GET stream or DELETE of its session)."""
    version = Request(scope).headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if version is None or version in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    return _rpc_error(
        types.INVALID_REQUEST,
        f"MCP-Protocol-Version {shown(version)}: send each request as a POST (MCP 2026-07-28 has no "
        "sessions and no GET stream).",
        status=405,
        headers={"Allow": "POST"},
    )


def _malformed(message: Any) -> Response | None:
    """The JSON-RPC error for a body that is not one well-formed MCP message, in every era alike: a batch
    (no revision the gateway speaks allows one), a message that is not JSON-RPC 2.0, or a response whose
    result is not an object or whose error lacks an integer code and a message is -32600, a request
    whose params are not an object -32602, each with a short message of its own. Without this the
    handshake era's transport answers all of them -32602 with a dump of its parser's errors (its internals,
    and pieces of the body). None for a body to pass on (one that is not JSON at all gets the SDK's
    -32700)."""
    if message is _UNREADABLE:
        return None
    if isinstance(message, list):
        return _rpc_error(
            types.INVALID_REQUEST, "Batches are not supported: send one JSON-RPC message per request."
        )
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return _rpc_error(types.INVALID_REQUEST, 'The body is not a JSON-RPC 2.0 message ("jsonrpc": "2.0").')
    if "method" not in message:  # a client's response to a request the hub sent it
        # An error may have a null id: the client could not read the id of what it answers.
        answers = _valid_id(message.get("id")) or ("error" in message and message.get("id", 0) is None)
        if not answers or ("result" in message) == ("error" in message):
            return _rpc_error(
                types.INVALID_REQUEST, "A response needs a string or integer id, and a result or an error."
            )
        if "result" in message and not isinstance(message["result"], dict):
            return _rpc_error(types.INVALID_REQUEST, "A response's result must be an object.")
        error = message.get("error")
        sound = (
            isinstance(error, dict)
            and isinstance(error.get("code"), int)
            and not isinstance(error.get("code"), bool)
            and isinstance(error.get("message"), str)
        )
        if "error" in message and not sound:
            return _rpc_error(
                types.INVALID_REQUEST,
                "A response's error must be an object with an integer code and a message.",
            )
        return None
    if not isinstance(message["method"], str):
        return _rpc_error(types.INVALID_REQUEST, "The method must be a string.")
    if "id" in message and not _valid_id(message["id"]):
        return _rpc_error(types.INVALID_REQUEST, "A request's id must be a string or an integer.")
    if message.get("params") is not None and not isinstance(message["params"], dict):
        return _rpc_error(types.INVALID_PARAMS, "params must be an object.", message.get("id"))
    problem = _meta_problem(message.get("params") or {}) or _params_problem(
        message["method"], message.get("params") or {}
    )
    if problem is not None:
        return _rpc_error(types.INVALID_PARAMS, problem, message.get("id"))
    return None


def _meta_problem(params: dict[str, Any]) -> str | None:
    """What is wrong with a message's `params._meta`, in words, or None. The SDK's answer to a `_meta` that
    is not an object, or to a progress token that is neither a string nor an integer, is "Invalid request
    parameters", without saying which."""
    meta = params.get("_meta")
    if meta is None:
        return None
    if not isinstance(meta, dict):
        return (
            "params._meta must be an object (in MCP 2026-07-28, one carrying "
            "'io.modelcontextprotocol/protocolVersion' and 'io.modelcontextprotocol/clientCapabilities')."
        )
    if "progressToken" in meta and not _valid_id(meta["progressToken"]):
        return "params._meta.progressToken must be a string or an integer."
    return None


# The params of the gateway's own methods a client most often gets wrong: (method, key, JSON type, required).
# The SDK's answer to any of them is "Invalid request parameters", without saying which.
_PARAM_TYPES: tuple[tuple[str, str, type[str] | type[dict[str, Any]], bool], ...] = (
    ("tools/call", "name", str, True),
    ("tools/call", "arguments", dict, False),
    ("tools/call", "inputResponses", dict, False),
    ("tools/call", "requestState", str, False),
    ("tools/list", "cursor", str, False),
)
_TYPE_NAMES: dict[type, str] = {str: "a string", dict: "an object"}


def _params_problem(method: str, params: dict[str, Any]) -> str | None:
    """What is wrong with a tools/call's or tools/list's params, in words, or None."""
    for named, key, kind, required in _PARAM_TYPES:
        if named != method:
            continue
        value = params.get(key)
        if value is None and not required:
            continue
        if not isinstance(value, kind):
            return f"{method} needs params.{key} to be {_TYPE_NAMES[kind]}."
    return None


def _unsupported_version(scope: Scope, message: Any) -> Response | None:
    """MCP's UnsupportedProtocolVersionError (-32022) for a request whose `MCP-Protocol-Version` the gateway
    does not serve, naming every version it does (`SERVED_VERSIONS`), as `server/discover` does; else None.
    The SDK's own answer names the 2026-07-28 ones only: a client that also speaks a handshake-era version
    read it as a server it cannot use, rather than one it can reach with `initialize`."""
    version = Request(scope).headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if version is None or version in SERVED_VERSIONS:
        return None
    if not isinstance(message, dict) or "method" not in message or not _valid_id(message.get("id")):
        return None  # a notification, or a response: the SDK answers it
    return JSONResponse(
        {
            "jsonrpc": "2.0",
            "id": message["id"],
            "error": {
                "code": types.UNSUPPORTED_PROTOCOL_VERSION,
                "message": "Unsupported protocol version",
                "data": {"supported": list(SERVED_VERSIONS), "requested": shown(version)},
            },
        },
        status_code=400,
    )


async def _called(
    request: Request, agent_id: int, slug: str | None
) -> tuple[str, catalog.ExposedTool | None, Mapping[str, Any] | None] | None:
    """A 2026-07-28 tools/call's tool, found once from its `Mcp-Name` header (which the SDK holds to the
    body's name before anything else reads it): (name, the tool or None, its input schema as tools/list shows
    it to this client). The SDK's Mcp-Param-* check takes the schema, `call_tool` the tool, instead of each
    looking for it among every tool of the agent. None for any other request."""
    version = request.headers.get("mcp-protocol-version", "")
    name = decode_header_value(request.headers.get(MCP_NAME_HEADER))
    if request.headers.get(MCP_METHOD_HEADER) != "tools/call" or name is None:
        return None
    if version not in MODERN_PROTOCOL_VERSIONS:
        return None
    exposed = await _db(catalog.find_tool, agent_id, name, slug)
    try:
        listed = None if exposed is None else _for_version(types.Tool.model_validate(exposed.spec), version)
    except ValueError:  # not a valid tool: not listed, so no header of it to check
        listed = None
    return name, exposed, None if listed is None else listed.input_schema


def _input_schema(name: str) -> Mapping[str, Any] | None:
    """The SDK's Mcp-Param-* check's schema for the tool ``name`` (the guard found it): None, nothing to
    check, for a tool not listed to this client, as the SDK's own walk of tools/list would find."""
    called = _CALLED.get()
    return called[1] if called is not None and called[0] == name else None


def _who(ctx: ServerRequestContext[Any, Any]) -> tuple[int, str | None]:
    request = ctx.request
    found = request.scope.get(SCOPE_KEY) if isinstance(request, Request) else None
    if not found:  # not through the guard: never served
        raise MCPError(types.INVALID_REQUEST, "Unauthenticated request.")
    return found["agent"], found["slug"]


def _object_properties(schema: Any) -> bool:
    """Whether every property of a tool's schema is an object, as the handshake era's schema has it (JSON
    Schema also allows `true`/`false`; the TypeScript SDK's client refuses a whole tool list over one)."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties is None or all(isinstance(value, dict) for value in properties.values())


def _fits(tools: list[dict[str, Any]], version: str) -> bool:
    """Whether `tools` make a valid tools/list result in protocol ``version`` (the SDK checks the result
    against the version's schema on the way out, and refuses all of it over one bad entry)."""
    probe = {"tools": tools, "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
    try:
        mcp_methods.validate_server_result("tools/list", version, probe)
    except (ValueError, KeyError):  # pydantic's ValidationError is a ValueError
        return False
    return version in MODERN_PROTOCOL_VERSIONS or all(
        _object_properties(tool.get("inputSchema")) and _object_properties(tool.get("outputSchema"))
        for tool in tools
    )


def _for_version(tool: types.Tool, version: str) -> types.Tool | None:
    """`tool` as protocol ``version`` allows it, or None to leave it out. An output schema the version does
    not allow (any JSON Schema since 2026-07-28, an object before) is left out of the tool, which a client
    may still call; a tool still invalid (an input schema not an object at its root) is not listed."""
    wire = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
    if _fits([wire], version):
        return tool
    if tool.output_schema is None:
        return None
    wire.pop("outputSchema")
    return tool.model_copy(update={"output_schema": None}) if _fits([wire], version) else None


async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    """One page of the agent's tools (`approvals.gateway.paging`), as its client's protocol version allows
    them: an upstream's tool that version refuses is mended or left out, never costing the agent the whole
    list (its page may then hold fewer tools)."""
    agent_id, slug = _who(ctx)
    version = ctx.protocol_version
    cursor = params.cursor if params is not None else None
    after = None if cursor is None else paging.position_of(cursor, agent_id, slug)
    size = paging.page_size()
    page = await _db(catalog.exposed_tools, agent_id, slug, after=after, limit=size + 1)
    next_cursor = None
    if len(page) > size:  # one more than a page: there is a next one, after this page's last tool
        page = page[:size]
        next_cursor = paging.cursor_for(catalog.position(page[-1].server, page[-1].name), agent_id, slug)
    found: list[tuple[catalog.ExposedTool, types.Tool]] = []
    left_out: list[catalog.ExposedTool] = []
    for exposed in page:
        try:
            found.append((exposed, types.Tool.model_validate(exposed.spec)))
        except ValueError:
            left_out.append(exposed)
    tools = [tool for _, tool in found]
    if not _fits([tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in tools], version):
        tools = []  # one tool or more the version refuses: find them one by one
        for exposed, tool in found:
            mended = _for_version(tool, version)
            if mended is not None:
                tools.append(mended)
            else:
                left_out.append(exposed)
    if left_out:  # one line per listing, however many tools a server got wrong
        logger.warning(
            "gateway: %d stored tool(s) not valid in MCP %s, not listed: %s",
            len(left_out),
            version,
            ", ".join(f"{tool.tool[:128]!r} of {tool.server}" for tool in left_out[:5]),
        )
    return types.ListToolsResult(tools=tools, next_cursor=next_cursor)


def _about(call: catalog.CallState) -> dict[str, Any]:
    """The hub's note in the result's _meta: the call's id and status, and its gate (digest, the diff of
    arguments a reviewer edited) when it had one."""
    about: dict[str, Any] = {"id": call.id, "status": call.status}
    if call.gate is not None:
        about["gate"] = call.gate
    return about


def _text_result(call: catalog.CallState, text: str) -> types.CallToolResult:
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "isError": True, "_meta": {CALL_META_KEY: _about(call)}}
    )


def _result_fits(result: types.CallToolResult, version: str) -> bool:
    """Whether `result` is a valid tools/call result in protocol ``version`` (the SDK checks it against the
    version's schema on the way out, and answers a bare internal error for one that is not)."""
    if version not in SERVED_VERSIONS:  # none the SDK checks a result against
        return True
    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    try:
        mcp_methods.validate_server_result("tools/call", version, {**wire, "resultType": "complete"})
    except (ValueError, KeyError):  # pydantic's ValidationError is a ValueError
        return False
    return True


def _with_structured_as_text(body: dict[str, Any]) -> dict[str, Any]:
    """`body` without its `structuredContent` (one the handshake era does not allow: not an object), whose
    JSON is then one more text item, unless a text item already holds that value (as MCP asks a tool with
    structured content to do)."""
    body = dict(body)
    value = body.pop("structuredContent")
    content = list(body.get("content") or [])
    for item in content:
        if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
            with contextlib.suppress(ValueError, RecursionError):
                if json.loads(item["text"]) == value:
                    return body
    body["content"] = [*content, {"type": "text", "text": json.dumps(value, ensure_ascii=False)}]
    return body


def final_result(call: catalog.CallState, version: str | None = None) -> types.CallToolResult:
    """What the agent gets for a final call: the upstream's CallToolResult when it completed; otherwise a
    tool error (`isError: true`) saying what happened, in words.

    ``version``: the client's protocol version. A result it does not allow (a 2026-07-28 upstream's
    `structuredContent` that is not an object, sent to a handshake-era client) is mended (that value goes
    as text), or else reported as a tool error holding its JSON: the SDK would answer the agent a bare
    internal error instead, for a call that ran, and again for every repeat of it."""
    error = call.error or {}
    if call.status == "completed" and isinstance(call.result, dict):
        about = _about(call)
        if call.result_truncated:  # over ELICIT_MAX_RESULT: the hub kept the start of its text
            about["result_truncated"] = True
        body = dict(call.result)
        # The upstream's own serverInfo stamp would pass its identity off as the hub's: without it, the SDK
        # stamps the hub's (on a 2026-07-28 result). Every other key of its _meta passes as it is.
        meta = {k: v for k, v in (body.get("_meta") or {}).items() if k != types.SERVER_INFO_META_KEY}
        body["_meta"] = {**meta, CALL_META_KEY: about}
        try:
            result = types.CallToolResult.model_validate(body)
        except ValueError:
            return _text_result(
                call, "The server's result is not a valid CallToolResult:\n" + json.dumps(call.result)
            )
        if version is None or _result_fits(result, version):
            return result
        if "structuredContent" in body and not isinstance(body["structuredContent"], dict):
            with contextlib.suppress(ValueError):
                mended = types.CallToolResult.model_validate(_with_structured_as_text(body))
                if _result_fits(mended, version):
                    return mended
        return _text_result(
            call,
            f"The server's result is not valid in MCP {version}, this client's version:\n"
            + json.dumps(call.result),
        )
    if call.status == "expired":
        message = error.get("message") or "No one answered before the deadline."
        if isinstance(call.result, dict):
            texts = [i.get("text") for i in call.result.get("content") or [] if isinstance(i, dict)]
            message += "\n" + "\n".join(t for t in texts if isinstance(t, str))
        return _text_result(call, f"The call expired: {message.strip()}")
    if call.status == "cancelled":
        return _text_result(call, "The call was cancelled before it finished.")
    if call.status == "failed" and error.get("code") == "declined":  # a gate's reviewer said no
        return _text_result(call, f"The call was declined and not sent: {error.get('message')}")
    if call.status == "failed":
        return _text_result(call, f"The call failed: {error.get('message') or 'unknown error'}")
    return _text_result(call, f"The call ended {call.status}.")


def _still_open(call: catalog.CallState, waited: float) -> types.CallToolResult:
    return _text_result(
        call,
        f"The hub stopped waiting after {int(waited)} s; the call is still {call.status} "
        f"({call.waiting_for}). Its outcome will be at GET /api/v1/calls/{call.id}.",
    )


async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    agent_id, slug = _who(ctx)
    request = ctx.request
    if params.request_state is not None:
        # A 2026-07-28 retry carrying answers to questions passed through to this client (the boundary has
        # already verified that the hub sealed this state, for this agent, tool name and arguments). Its
        # call was sent already: found by the call the state names, not by the tool lists of now (the
        # upstream may have dropped the tool meanwhile), and never sent again.
        agent = await _db(catalog.agent, agent_id)
        if agent is None:
            raise MCPError(types.INVALID_REQUEST, "This agent is no longer active.")
        call_id = await passthrough.record_responses(
            _db, agent, params.request_state, params.input_responses, params.name, slug
        )
        return await wait_for(ctx, call_id, agent=agent, client=passthrough.client_of(ctx))
    called = request.scope[SCOPE_KEY].get("called") if isinstance(request, Request) else None
    if called is not None and called[0] == params.name:
        exposed = called[1]
    else:
        exposed = await _db(catalog.find_tool, agent_id, params.name, slug)
    if exposed is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {shown(params.name)}")
    arguments = params.arguments or {}
    problem = safejson.problem(arguments, max_depth=settings.ELICIT_MAX_JSON_DEPTH)
    if problem:
        where, reason = problem
        raise MCPError(types.INVALID_PARAMS, f"The arguments hold {reason} at {where}.")
    key = (request.headers.get("idempotency-key") or "").strip() if isinstance(request, Request) else ""
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise MCPError(types.INVALID_PARAMS, f"The Idempotency-Key is over {MAX_IDEMPOTENCY_KEY} characters.")
    agent = await _db(catalog.agent, agent_id)
    if agent is None:
        raise MCPError(types.INVALID_REQUEST, "This agent is no longer active.")
    client = passthrough.client_of(ctx)
    if params.input_responses:
        raise MCPError(types.INVALID_PARAMS, "inputResponses without the requestState they answer.")
    try:
        if key:
            submitted, created = await _db(
                calls.call_submit,
                agent=agent,
                server_slug=exposed.server,
                tool=exposed.tool,
                arguments=arguments,
                idempotency_key=key,
                channel="mcp",
                agent_client=client,
            )
            # A client's headers are the same on every request of its connection: a key set once reaches
            # every tools/call, and must not answer one tool with the result of another.
            other = None
            if not created:
                other = await _db(
                    calls.other_request,
                    submitted,
                    server_slug=exposed.server,
                    tool=exposed.tool,
                    arguments=arguments,
                )
            if other is not None:
                raise MCPError(
                    types.INVALID_PARAMS,
                    f"The Idempotency-Key {key!r} was already used for another call ({other}; call "
                    f"{submitted.pk}): a new call needs a new key.",
                    {"code": "idempotency_key_reused", "call": str(submitted.pk)},
                )
        else:
            submitted, _created = await _db(
                calls.call_submit_or_repeat,
                agent=agent,
                server_slug=exposed.server,
                tool=exposed.tool,
                arguments=arguments,
                window=settings.ELICIT_GATEWAY_REPEAT_WINDOW,
                channel="mcp",
                agent_client=client,
            )
    except ServiceError as exc:
        raise MCPError(types.INVALID_PARAMS, exc.message) from None
    return await wait_for(ctx, submitted.pk, agent=agent, client=client)


async def wait_for(
    ctx: ServerRequestContext[Any, Any],
    call_id: Any,
    *,
    agent: AgentClient,
    client: dict[str, Any],
) -> types.CallToolResult | types.InputRequiredResult:
    """Wait until the call is final, telling a client that asked for progress what it waits for every
    ELICIT_GATEWAY_PROGRESS_INTERVAL seconds. Cancelled (the agent went away): the call goes on. The agent is
    checked again before each look at the call: one deactivated or given a new token while it waited (up to
    ELICIT_GATEWAY_MAX_WAIT, a day) gets an error, not the call's result; the call goes on on the hub.

    A round whose rule passed it through to the requester is put to this client: returned as
    `input_required` to a 2026-07-28 client, pushed as `elicitation/create` to a handshake-era one."""
    interval = settings.ELICIT_GATEWAY_PROGRESS_INTERVAL
    loop_time = anyio.current_time
    started = loop_time()
    ticks = 0
    asked: set[str] = set()  # questions pushed to this handshake-era client during this wait
    looked = False  # the first look follows the request's own authentication
    while True:
        if looked and not await _db(catalog.still_holds, agent):
            raise MCPError(
                types.INVALID_REQUEST,
                "This agent was deactivated or its token replaced while the call waited: the hub no longer "
                f"answers it here (call {call_id} goes on).",
                {"reason": "agent_revoked"},
            )
        looked = True
        state = await _db(catalog.call_state, call_id)
        if state is None:
            raise MCPError(types.INTERNAL_ERROR, f"The call {call_id} no longer exists on the hub.")
        if state.is_final:
            return final_result(state, ctx.protocol_version)
        asks = await _db(catalog.requester_asks, call_id)
        asks = [ask for ask in asks if ask.mode in client["modes"] and ask.id not in asked]
        if asks and client["era"] == passthrough.MODERN:
            return passthrough.input_required(str(call_id), asks)
        waited = loop_time() - started
        if asks:
            asked.update(ask.id for ask in asks)
            await passthrough.elicit_on_session(
                ctx, _db, agent, asks, settings.ELICIT_GATEWAY_MAX_WAIT - waited
            )
            continue
        if waited >= settings.ELICIT_GATEWAY_MAX_WAIT:
            return _still_open(state, waited)
        ticks += 1
        # The call's id, from the first notification on (sent as soon as the call is submitted): the agent
        # can read or cancel the call over the REST API (GET /api/v1/calls/<id>) while it waits here.
        await ctx.session.report_progress(ticks, None, f"{state.waiting_for} (call {state.id})")
        with contextlib.suppress(ToolCall.DoesNotExist):  # deleted meanwhile: the next read says so
            await broadcast.wait_until_final(
                call_id,
                min(interval, settings.ELICIT_GATEWAY_MAX_WAIT - waited),
                lambda: _db(catalog.call_row, call_id, client["modes"], set(asked)),
            )


H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


def never_leaks(handler: H) -> H:
    """A handler's unexpected failure reaches the agent as a plain internal error, its details only the log
    (an exception's text can name tables, hosts or values); MCP errors pass as they are."""

    @functools.wraps(handler)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return await handler(*args, **kwargs)
        except MCPError:
            raise
        except Exception as exc:
            engine = outage.engine_of(exc)
            if engine is not None:
                # An engine down, or refusing writes (a read-only PostgreSQL after a failover): its handler's
                # transaction stored nothing, and the agent is told so (as the REST API's 503 says).
                name = type(exc).__name__
                logger.warning("gateway: %s: %s unavailable (%s)", handler.__name__, engine, name)
                raise MCPError(types.INTERNAL_ERROR, outage.error_body(engine)["error"]["message"]) from None
            logger.exception("gateway: %s failed", handler.__name__)
            raise MCPError(
                types.INTERNAL_ERROR, "The hub could not serve this request; a call it started goes on."
            ) from None

    return guarded  # type: ignore[return-value]


class GatewayServer(Server[Any]):
    """The SDK's server, saying in a handshake-era `initialize` result that the gateway sends
    `notifications/tools/list_changed` (`tools.listChanged: true`). A 2026-07-28 client reads the same in
    `server/discover`, which the SDK derives from the `subscriptions/listen` handler.

    `server/discover` names every version the endpoint serves (`SERVED_VERSIONS`), as MCP asks of a dual-era
    server: the SDK's own answer names the 2026-07-28 ones only, which told a client (or a dashboard showing
    the hub) that a handshake-era client could not use it."""

    async def _handle_discover(
        self, ctx: ServerRequestContext[Any], params: types.RequestParams | None
    ) -> types.DiscoverResult:
        found = await super()._handle_discover(ctx, params)
        return found.model_copy(update={"supported_versions": list(SERVED_VERSIONS)})

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def session_watcher(watch: changes.ToolWatch, manager: StreamableHTTPSessionManager) -> ServerMiddleware[Any]:
    """A server middleware that puts each handshake-era session on ``watch`` once it is initialized (at its
    `notifications/initialized`, or its first request after `initialize`), until the session ends: its
    client is then sent `notifications/tools/list_changed` on its GET stream when its tools change. The GET
    stream of a session whose agent is revoked is closed (an open GET stream keeps a session from ever
    going idle: it would outlive the credential that opened it)."""
    sessions: dict[str, changes.Listener] = {}

    async def watch_session(ctx: ServerRequestContext[Any, Any], session_id: str | None) -> None:
        request = ctx.request
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or not isinstance(request, Request):
            return
        found = request.scope.get(SCOPE_KEY)
        if not session_id or not found:
            return
        if session_id in sessions:
            # The agent's requests on the session carry its token now (one rotated since is still its own).
            sessions[session_id].token_hash = found.get("token_hash") or ""
            return
        if session_id not in manager._server_instances:
            return
        session = ctx.session

        async def notify() -> None:
            await session.send_tool_list_changed()

        async def end() -> None:
            # Its GET stream only: a tools/call still waiting on the session gets its `agent_revoked` error
            # from `wait_for`; with no request left in flight the session then idles out. No longer watched:
            # forgotten here too, so that a request with the agent's new token watches the session again.
            sessions.pop(session_id, None)
            transport = manager._server_instances.get(session_id)
            if transport is not None:
                logger.info(
                    "gateway: closing the GET stream of a session of agent %s: revoked", found["agent"]
                )
                transport.close_standalone_sse_stream()

        def alive() -> bool:
            if session_id in manager._server_instances:
                return True
            sessions.pop(session_id, None)
            return False

        listener = changes.Listener(
            (found["agent"], found["slug"]), found.get("token_hash") or "", notify, end, alive
        )
        sessions[session_id] = listener
        try:
            await watch.add(listener)
        except Exception:  # the engines are away: this session is not told of changes, its requests go on
            sessions.pop(session_id, None)
            watch.remove(listener)
            logger.warning("gateway: a session could not be watched for tool list changes", exc_info=True)

    async def watching(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "initialize":
            # Once answered, so that a session whose client opens its GET stream and sends nothing else is
            # watched too (the request names no session yet: the session's own connection does).
            result = await call_next(ctx)
            connection = getattr(ctx.session, "_connection", None)
            await watch_session(ctx, getattr(connection, "session_id", None))
            return result
        # Before any other request: a session's first one may be a tools/call waiting for hours.
        request = ctx.request
        if isinstance(request, Request):
            await watch_session(ctx, request.headers.get(MCP_SESSION_ID_HEADER))
        return await call_next(ctx)

    return watching


def listen_handler(
    watch: changes.ToolWatch,
) -> Callable[
    [ServerRequestContext[Any, Any], types.SubscriptionsListenRequestParams],
    Awaitable[types.SubscriptionsListenResult],
]:
    """`subscriptions/listen` (2026-07-28): the stream stays open, acknowledged with what it honors (tool
    list changes only: the gateway serves no prompts nor resources), and carries
    `notifications/tools/list_changed` when the agent's tools on this endpoint change. One agent holds at
    most its share of streams (`agent_sessions`); a revoked agent's streams end."""

    async def listen(
        ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        agent_id, slug = _who(ctx)
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen needs a request id.")
        request = ctx.request
        found = request.scope.get(SCOPE_KEY, {}) if isinstance(request, Request) else {}
        held = watch.streams_of(agent_id)
        if held >= agent_sessions() or watch.streams_of(None) >= settings.ELICIT_GATEWAY_MAX_SESSIONS:
            raise MCPError(
                types.INVALID_REQUEST,
                f"Too many open subscriptions/listen streams (this agent holds {held}; one agent may hold "
                f"{agent_sessions()}): close one.",
                {"reason": "too_many_streams"},
            )
        wanted = bool(params.notifications.tools_list_changed)
        honored = types.SubscriptionFilter(tools_list_changed=True if wanted else None)
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        changed = anyio.Event()
        ended = anyio.Event()
        pending = [False]

        async def notify() -> None:
            pending[0] = True
            changed.set()

        async def end() -> None:
            ended.set()
            changed.set()

        listener = changes.Listener((agent_id, slug), found.get("token_hash") or "", notify, end, stream=True)
        await watch.add(listener)
        try:
            await ctx.session.send_notification(
                types.SubscriptionsAcknowledgedNotification(
                    params=types.SubscriptionsAcknowledgedNotificationParams(
                        notifications=honored, _meta=meta
                    )
                ),
                related_request_id=subscription_id,
            )
            while not ended.is_set():
                await changed.wait()
                changed = anyio.Event()
                if pending[0] and wanted and not ended.is_set():
                    pending[0] = False
                    await ctx.session.send_notification(
                        types.ToolListChangedNotification(params=types.NotificationParams(_meta=meta)),
                        related_request_id=subscription_id,
                    )
        finally:
            watch.remove(listener)
        return types.SubscriptionsListenResult(_meta=meta)

    return listen


def build_app() -> Starlette:
    """The gateway's ASGI application (served by uvicorn: its lifespan runs the session manager)."""
    watch = changes.ToolWatch()
    server: Server[Any] = GatewayServer(
        "elicit-hub",
        version="1",
        instructions=(
            "Tools of the MCP servers this agent may use, called through Elicit Hub. A call whose server "
            "asks for input waits while people answer; ask for progress to hear what it waits for."
        ),
        get_tool_input_schema=_input_schema,
        on_list_tools=never_leaks(list_tools),
        on_call_tool=never_leaks(call_tool),
        on_subscriptions_listen=never_leaks(listen_handler(watch)),
    )
    server.middleware.append(passthrough.boundary())
    manager = StreamableHTTPSessionManager(
        app=server,
        # Bearer tokens, not cookies, authenticate every request, so a rebound DNS name gains a page nothing.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=settings.ELICIT_MAX_BODY,
        session_idle_timeout=settings.ELICIT_GATEWAY_SESSION_IDLE,
        max_sessions=settings.ELICIT_GATEWAY_MAX_SESSIONS,
    )
    server.middleware.insert(0, session_watcher(watch, manager))
    in_flight = InFlight()
    server.middleware.insert(0, request_ids(in_flight))
    guarded = Guard(StreamableHTTPASGIApp(manager), manager, in_flight)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "not_found", "The hub's MCP endpoints are /mcp and /mcp/<server-slug>.")

    # With a trailing slash too, as a client is often configured: Starlette would otherwise redirect it to
    # the URL without, built from the Host header and this process's scheme (plain http behind a TLS proxy,
    # where a client following it drops the bearer token or sends it in the clear).
    return Starlette(
        routes=[
            Route("/mcp", endpoint=guarded),
            Route("/mcp/", endpoint=guarded),
            Route("/mcp/{slug}", endpoint=guarded),
            Route("/mcp/{slug}/", endpoint=guarded),
            Route("/healthz", endpoint=healthz),
        ],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )
