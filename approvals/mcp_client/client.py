"""The MCP 2026-07-28 client of the hub, on the official SDK's session layer.

One `mcp.Client` per operation (``mode="2026-07-28"``, no handshake, no probe); the SDK stamps
``_meta`` (protocol version, client info, capabilities), ``MCP-Protocol-Version``, ``Mcp-Method``,
``Mcp-Name`` and ``Mcp-Param-*`` on every request and parses JSON and SSE answers. This module adds
what a hub that parks rounds across processes needs (the wire-level part lives in `transport`):

- JSON-RPC ids unique across processes (a retried round never reuses the first round's id),
- the raw result of every answer (``input_required`` kept verbatim, a missing ``resultType`` read as
  ``complete`` instead of failing validation),
- the ``Idempotency-Key`` header on ``tools/call``, the HTTP status and ``Retry-After`` for classifying
  failures, recovery from ``-32022`` and ``-32020``, and the mapping of everything else to
  `TransientError` / `PermanentError`, with ``may_have_run`` once a ``tools/call`` left the hub unless the
  server's answer proves it refused the call (`REFUSALS`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types
from jsonschema import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from mcp import Client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp_types import (
    HEADER_MISMATCH,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from referencing import Registry

from approvals import netguard, urlparts
from approvals.mcp_client import loop
from approvals.mcp_client.outcomes import (
    Completed,
    McpError,
    Outcome,
    PermanentError,
    ServerConfig,
    TransientError,
)
from approvals.mcp_client.toollist import ToolList
from approvals.mcp_client.transport import InflatingTransport, TeeTransport, Wire, http_stream
from approvals.mcp_client.wire import (
    PROTOCOL_VERSION,
    classify_rpc_error,
    invalid_header_reason,
    listed,
    quoted,
    read_call_result,
    scrub,
    validation_summary,
)

logger = logging.getLogger(__name__)


T = TypeVar("T")
# Awaited with (progress, total, message) for each progress notification of a tools/call.
ProgressFn = ProgressFnT

CLIENT_NAME = "elicit-hub"
# Opening a connection is never slow for a healthy server, however long its tools run.
CONNECT_TIMEOUT = 10.0
# The HTTP read timeout of a tools/call stays this far above its limit, so the session's own timeout
# (which also tells the server to stop) fires first.
READ_SLACK = 5.0


def _client_version() -> str:
    try:
        return importlib.metadata.version("elicit-hub")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.1.0"


CLIENT_INFO = mcp_types.Implementation(name=CLIENT_NAME, version=_client_version())


async def _refuse_elicitation(context: Any, params: Any) -> Any:
    """Declares the elicitation capability (SDK trap 2); never called on the session layer."""
    raise RuntimeError("the hub answers elicitations through reviewers, never in-process")


# ---- errors ------------------------------------------------------------------------------------


def _secrets(server: ServerConfig, request_state: str | None = None) -> list[str]:
    """What no error message may repeat: the server's header values (and their long words), what its URL
    hides when shown (a key in its query, a password), the round's requestState."""
    found: list[str] = []
    for value in server.headers.values():
        found.append(value)
        found.extend(part for part in value.split() if len(part) >= 8)
    found.extend(urlparts.hidden_parts(server.url))
    if request_state:
        found.append(request_state)
    return found


# How the SDK refuses the protocol version a server answered ``initialize`` with (a RuntimeError).
UNSUPPORTED_ANSWER = "Unsupported protocol version from the server:"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _classify(exc: BaseException, wire: Wire, what: str, secret: list[str]) -> McpError:
    """Map whatever came out of the SDK (possibly an exception group) to one `McpError`."""
    what = wire.method or what
    leaves = [leaf for leaf in _leaves(exc) if not isinstance(leaf, anyio.get_cancelled_exc_class())]
    if not leaves:
        return TransientError("network_error", f"{what} was interrupted")

    def rank(leaf: BaseException) -> int:
        if isinstance(leaf, McpError):
            return 0
        if isinstance(leaf, httpx2.HTTPError):
            return 1
        if isinstance(leaf, MCPError):
            return 2
        return 3

    leaf = min(leaves, key=rank)
    if isinstance(leaf, McpError):
        return leaf
    if isinstance(leaf, httpx2.TimeoutException):
        return TransientError("timeout", f"no answer to {what} in time ({type(leaf).__name__})")
    if isinstance(leaf, httpx2.ConnectError):
        return TransientError("connect_failed", f"could not connect to the MCP server for {what}")
    if isinstance(leaf, httpx2.UnsupportedProtocol | httpx2.InvalidURL):
        return PermanentError("invalid_url", f"the server URL cannot be used: {scrub(str(leaf), secret)}")
    if isinstance(leaf, httpx2.HTTPError):
        return TransientError("network_error", f"the connection failed during {what} ({type(leaf).__name__})")
    if isinstance(leaf, MCPError):
        return classify_rpc_error(leaf.code, leaf.message, leaf.data, wire.http, what=what, secrets=secret)
    if isinstance(leaf, ValidationError):
        return PermanentError(
            "malformed_response", f"the server's answer to {what} is malformed: {validation_summary(leaf)}"
        )
    if isinstance(leaf, TimeoutError):
        return TransientError("timeout", f"no answer to {what} in time")
    if isinstance(leaf, RuntimeError) and str(leaf).startswith(UNSUPPORTED_ANSWER):
        # The SDK's own check of the version a server answered initialize with.
        version = scrub(str(leaf)[len(UNSUPPORTED_ANSWER) :].strip(), secret)
        return PermanentError(
            "protocol_unsupported",
            f"the server answered {what} with protocol version {quoted(version)}, which the hub does not "
            f"speak (it speaks {PROTOCOL_VERSION} and {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)})",
        )
    return PermanentError(
        "unexpected_error", f"{type(leaf).__name__} during {what}: {scrub(str(leaf), secret)}"
    )


# The HTTP statuses of a tools/call POST that prove the server (or a proxy before it) refused the request
# before running it: a request it could not read, accept or route, or would not take from us (400, 401, 403,
# 404, 405, 406, 411, 413, 414, 415, 422, 431), a rate limit (429), or a redirect the SDK did not follow
# (307 and 308 ask for the same request elsewhere). Nothing else proves it: a 5xx (a gateway's 502 or 504 may
# come after it forwarded the call, a 503 with Retry-After too), 408, 409 (what an Idempotency-Key server
# answers while the first request still runs), 410, nor another 3xx (a 302 or 303 after a POST may follow its
# processing).
REFUSALS = frozenset({307, 308, 400, 401, 403, 404, 405, 406, 411, 413, 414, 415, 422, 429, 431})
# The server's own answer to a tools/call it accepted (a JSON-RPC error; a round asking for input the hub
# cannot give): it says what became of the call. Any other failure after the POST was accepted (its stream
# ended without the result, the answer is malformed or too large) lost the result of a tool that may have run.
_ANSWERED = frozenset(
    {
        "rpc_error",
        "unknown_tool",
        "header_mismatch",
        "request_state_rejected",
        "protocol_unsupported",
        "unsupported_input_request",
    }
)


def _refused(error: McpError, wire: Wire) -> bool:
    """Whether the server's answer to the last tools/call POST proves the tool did not run (or says itself
    what became of it)."""
    status = wire.call_http.status if wire.call_http is not None else None
    if status in REFUSALS:
        return True
    return status is not None and 200 <= status < 300 and error.code in _ANSWERED


def _verdict(exc: BaseException, wire: Wire, what: str, secret: list[str]) -> McpError:
    """`_classify`, and whether the tool may have run (`after_send`)."""
    return after_send(_classify(exc, wire, what, secret), wire)


def after_send(error: McpError, wire: Wire, *, written: bool = False) -> McpError:
    """`error` with whether the tool may have run: once a tools/call left the hub, every failure but a
    refusal (`_refused`) leaves its fate open, whatever status or error it came with. `written`: the call
    went out on a byte stream (stdio), where only the server's own answer (a JSON-RPC error) says what became
    of it."""
    if written:
        if error.may_have_run or error.code in _ANSWERED:
            return error
    elif not wire.call_sent or error.may_have_run or _refused(error, wire):
        return error
    return type(error)(
        error.code,
        error.message + "; the request had reached the server, so the tool may have run",
        rpc_code=error.rpc_code,
        retry_after=error.retry_after,
        may_have_run=True,
    )


# ---- one operation on one client ---------------------------------------------------------------


def _prior_discover(server: ServerConfig) -> mcp_types.DiscoverResult | None:
    if server.discover is None:
        return None
    try:
        prior = mcp_types.DiscoverResult.model_validate(server.discover)
    except ValidationError:
        logger.warning("ignoring an unreadable cached server/discover result")
        return None
    if not any(v in prior.supported_versions for v in MODERN_PROTOCOL_VERSIONS):
        offered = listed(prior.supported_versions)
        raise PermanentError(
            "protocol_unsupported", f"this server does not speak MCP {PROTOCOL_VERSION} (it offers {offered})"
        )
    return prior


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process: loading the CA bundle costs ~75 ms per client otherwise."""
    return ssl.create_default_context()


async def _check_url(url: str) -> netguard.Checked:
    """The outbound guard's verdict on a server URL, before any connection is opened."""
    try:
        return await netguard.acheck_url(url, allow=netguard.configured())
    except netguard.Refused as exc:
        if exc.transient:
            raise TransientError(
                "connect_failed", f"the server URL cannot be used now: {exc.message}"
            ) from None
        raise PermanentError("url_refused", f"the server URL is refused: {exc.message}") from None


def _guarded_http(
    server: ServerConfig, wire: Wire, timeout: httpx2.Timeout, checked: netguard.Checked | None = None
) -> httpx2.AsyncClient:
    """The HTTP client of one exchange with `server`: its headers, TLS verified, no proxy from the
    environment, every request recorded on `wire` and sent to the address the outbound guard checked for its
    URL (`checked`: the check made before connecting, by `_check_url`). A stored header HTTP cannot carry
    (a server saved before headers were checked) is a `PermanentError` ``invalid_headers``: nothing sent."""
    try:
        return httpx2.AsyncClient(
            headers=dict(server.headers),
            timeout=timeout,
            transport=InflatingTransport(
                netguard.AsyncGuardedTransport(checked=checked, verify=_tls_context())
            ),
            trust_env=False,
            event_hooks={"request": [wire.on_request], "response": [wire.on_response]},
        )
    except (UnicodeError, ValueError):  # its message quotes the value: not repeated
        raise PermanentError(
            "invalid_headers", "a header stored for this server holds characters HTTP cannot carry"
        ) from None


async def _operate(
    server: ServerConfig,
    op: Callable[[Client, Wire], Awaitable[T]],
    *,
    what: str,
    idempotency_key: str | None = None,
    request_state: str | None = None,
    call_timeout: float | None = None,
) -> T:
    """Open a client on `server`, run `op`, close it, and map every failure to an `McpError`.

    Each exchange is bounded by ``server.timeout``; a ``tools/call`` by `call_timeout` (its whole run,
    the HTTP read timeout of its idle stream just above it). Connecting is bounded by `CONNECT_TIMEOUT`.
    """
    secret = _secrets(server, request_state)
    wire = Wire(idempotency_key)
    prior = _prior_discover(server)
    checked = await _check_url(server.url)
    longest = server.timeout if call_timeout is None else max(server.timeout, call_timeout + READ_SLACK)
    timeout = httpx2.Timeout(server.timeout, connect=min(server.timeout, CONNECT_TIMEOUT), read=longest)
    http = _guarded_http(server, wire, timeout, checked)
    failure: BaseException | None = None
    value: Any = None
    try:
        with anyio.fail_after(server.timeout * 4 + (longest if call_timeout is not None else 0)):
            async with (
                http,
                Client(
                    TeeTransport(http_stream(server.url, http), wire),
                    mode=PROTOCOL_VERSION,
                    prior_discover=prior,
                    client_info=CLIENT_INFO,
                    elicitation_callback=_refuse_elicitation,
                    read_timeout_seconds=server.timeout,
                    cache=None,
                ) as client,
            ):
                try:
                    value = await op(client, wire)
                except Exception as exc:  # classified below, outside the SDK's task groups
                    failure = exc
    except Exception as exc:
        raise _verdict(exc, wire, what, secret) from None
    except BaseExceptionGroup as group:
        # A failure mixed with cancellations; a pure cancellation propagates untouched.
        cancelled = anyio.get_cancelled_exc_class()
        if all(isinstance(leaf, cancelled) for leaf in _leaves(group)):
            raise
        raise _verdict(group, wire, what, secret) from None
    if failure is not None:
        raise _verdict(failure, wire, what, secret) from None
    return value


async def _send(client: Client, send: Callable[[], Awaitable[T]]) -> T:
    """Send one request; on -32022 naming a version we speak, switch to it and send once more."""
    try:
        return await send()
    except MCPError as exc:
        if exc.code != UNSUPPORTED_PROTOCOL_VERSION:
            raise
        data = exc.data if isinstance(exc.data, dict) else {}
        supported = data.get("supported")
        if not isinstance(supported, list) or not any(v in supported for v in MODERN_PROTOCOL_VERSIONS):
            raise
        session = client.session
        base = session.discover_result or mcp_types.DiscoverResult(
            supported_versions=[],
            capabilities=mcp_types.ServerCapabilities(),
            result_type="complete",
            ttl_ms=0,
            cache_scope="private",
        )
        session.adopt(base.model_copy(update={"supported_versions": [str(v) for v in supported]}))
        return await send()


async def _list_all(client: Client, wire: Wire, *, watch: str | None = None) -> tuple[ToolList, bool]:
    """``tools/list``, page after page while the list is not full (`toollist`): (the valid tools as
    received, at most what the hub keeps; whether the tool named `watch` was listed with invalid headers).
    Only that one name is looked for: the names of the tools left out are not kept (pages of them, however
    many, are not the hub's to hold).

    The SDK drops tools with invalid ``x-mcp-header`` annotations and remembers the valid ones'
    header maps and output schemas for the calls that follow, the last listed under each name; a name listed
    again is the first definition's (`toollist`), so the session is taught that one again once the list is
    read: a call checks its result and sends its ``Mcp-Param-*`` headers by the definition the hub stores.
    """
    tools = ToolList()
    invalid = False
    again: set[str] = set()  # names listed more than once, whose first definition the hub kept
    cursor: str | None = None
    pages = 0
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None

        async def send_page(p: mcp_types.PaginatedRequestParams | None = params) -> mcp_types.ListToolsResult:
            return await client.session.list_tools(params=p)

        page = await _send(client, send_page)
        pages += 1
        kept = {tool.name for tool in page.tools}
        raw = wire.last_result or {}
        for tool in raw.get("tools") or []:
            if not isinstance(tool, dict):
                continue
            if tool.get("name") in kept and invalid_header_reason(tool.get("inputSchema")) is None:
                before = tools.duplicates
                tools.offer(tool)  # refused once the list is full; the page's invalid names still count
                if tools.duplicates > before:
                    again.add(tool["name"])
            elif watch is not None and tool.get("name") == watch:
                invalid = True
        if not tools.more(page.next_cursor, pages):
            break
        cursor = page.next_cursor
    teach_first(client, tools, again)
    # The tool `watch` is dropped only when no valid definition of it was kept.
    dropped = invalid and not any(tool.get("name") == watch for tool in tools)
    return tools, dropped


async def _call_once(
    client: Client,
    wire: Wire,
    name: str,
    arguments: dict[str, Any] | None,
    input_responses: Any,
    request_state: str | None,
    what: str,
    call_timeout: float | None = None,
    on_progress: ProgressFn | None = None,
) -> Outcome:
    wire.last_result = None
    try:
        await _send(
            client,
            lambda: client.session.call_tool(
                name,
                arguments,
                read_timeout_seconds=call_timeout,
                progress_callback=on_progress,
                input_responses=input_responses,
                request_state=request_state,
                allow_input_required=True,
            ),
        )
    except RuntimeError as exc:
        # The output-schema check runs after the tool has run (SDK trap 3): an outcome, not a failure.
        if wire.last_result is None:
            raise
        outcome = read_call_result(wire.last_result, what)
        if isinstance(outcome, Completed):
            return Completed(outcome.result, output_schema_error=scrub(str(exc), []))
        return outcome
    except ValidationError:
        if wire.last_result is None:
            raise
        return read_call_result(wire.last_result, what)  # raises malformed_response with a safe summary
    if wire.last_result is None:
        raise PermanentError("malformed_response", f"the server's answer to {what} carried no result")
    return read_call_result(wire.last_result, what)


def _stored_tool(tool: dict[str, Any] | None, name: str) -> mcp_types.Tool | None:
    """The stored definition of tool `name` as the SDK's type, or None (then the call lists the tools):
    none given, another tool's, invalid ``x-mcp-header`` annotations, or a shape the SDK does not accept."""
    if not isinstance(tool, dict) or tool.get("name") != name:
        return None
    try:
        known = mcp_types.Tool.model_validate(tool, by_name=False)
    except ValidationError:
        return None
    return None if invalid_header_reason(tool.get("inputSchema")) is not None else known


def teach_first(client: Client, tools: ToolList, names: set[str]) -> None:
    """After a listing in which `names` were listed more than once: teach the session the definition of each
    that `tools` kept (the first), in place of the last one it absorbed."""
    for tool in tools:
        if tool.get("name") in names:
            _learn_tool(client, mcp_types.Tool.model_validate(tool, by_name=False))


def _learn_tool(client: Client, tool: mcp_types.Tool) -> None:
    """Give the session what a ``tools/list`` naming `tool` would have taught it (its Mcp-Param-* header
    map and output schema), without asking the server. Not a complete listing: nothing else is dropped."""
    listing = mcp_types.ListToolsResult(tools=[tool])
    client.session._absorb_tool_listing(listing, complete=False)


# The output schemas compiled once per process: at most this many, each at most this long as canonical JSON.
SHARED_SCHEMAS = 256
MAX_SHARED_SCHEMA = 64 * 1024


@functools.lru_cache(maxsize=SHARED_SCHEMAS)
def _compiled_output_schema(schema_json: str) -> Validator | None:
    """The validator the SDK would compile for this output schema, or None when the schema is not valid JSON
    Schema (the SDK then compiles it itself and reports it, as before).

    The SDK compiles a tool's output schema once per session, and the hub opens a session per send, so
    every completed call checked the same schema against its metaschema again: 0.4 ms for a one-field
    schema, 6 ms and more for a typed tool's nested models, against 3-5 ms for the rest of a send's client
    work (`make bench BENCH=sends`). Compiled once per process instead, keyed by the schema's canonical text.
    The SDK builds it the same way (`ClientSession._output_schema_validator`): no format checker, and an
    empty registry, so a ``$ref`` resolves only within the schema.
    """
    schema = json.loads(schema_json)
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema, registry=Registry())


def _shared_validator(schema: object) -> Validator | None:
    """This process's compiled validator for an output schema, or None for one it does not share: not a JSON
    object, longer than `MAX_SHARED_SCHEMA` once serialised (the cache stays small whatever servers send), or
    not valid JSON Schema. The SDK compiles those itself, per session, as before."""
    if not isinstance(schema, dict):
        return None
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None
    if len(text) > MAX_SHARED_SCHEMA:
        return None
    return _compiled_output_schema(text)


def _prepare_output_check(client: Client, name: str) -> None:
    """Just before calling tool `name`, once the session has learned or listed the tools: the session checks
    the result with this process's compiled validator for the tool's output schema, if it has one. A tool the
    session does not know (the server serves it but does not list it) is checked against nothing: the SDK
    would list the tools again after the tool has run, and that listing's answer would take the result's
    place (the call, which ran, would end as malformed)."""
    session = client.session
    if name not in session._tool_output_schemas:
        session._tool_output_schemas[name] = None
    if name in session._tool_output_validators:
        return
    validator = _shared_validator(session._tool_output_schemas.get(name))
    if validator is not None:
        session._tool_output_validators[name] = validator


def _typed_input_responses(input_responses: dict[str, Any] | None, what: str) -> Any:
    if input_responses is None:
        return None
    if not isinstance(input_responses, dict):
        raise PermanentError("invalid_input_responses", f"the answers for {what} are not an object")
    try:
        params = mcp_types.CallToolRequestParams.model_validate(
            {"name": "-", "inputResponses": input_responses}, by_name=False
        )
    except ValidationError as exc:
        raise PermanentError(
            "invalid_input_responses", f"the answers for {what} are malformed: {validation_summary(exc)}"
        ) from None
    return params.input_responses


# ---- public API --------------------------------------------------------------------------------


async def call_tool(
    server: ServerConfig,
    name: str,
    arguments: dict[str, Any] | None,
    *,
    input_responses: dict[str, Any] | None = None,
    request_state: str | None = None,
    idempotency_key: str | None = None,
    call_timeout: float | None = None,
    on_progress: ProgressFn | None = None,
    tool: dict[str, Any] | None = None,
) -> Outcome:
    """Call tool `name` once (one round): ``tools/list``, then ``tools/call``; only ``tools/call`` when
    `tool` is given.

    `arguments` go out untouched. For a retry pass the answers (``{key: ElicitResult JSON}``) and the
    previous round's `request_state` exactly as received (none is sent when it is None). Returns
    `Completed`, `ToolError` or `InputRequired`; raises `TransientError` / `PermanentError` (with
    `may_have_run` when the call reached the server and its outcome is unknown).

    `call_timeout` bounds the ``tools/call`` (default: ``server.timeout``). `on_progress` is awaited with
    (progress, total, message) for each progress notification; a ``progressToken`` is sent with it.

    `tool` is the tool's definition as a ``tools/list`` of this server gave it (the hub's stored list): the
    client learns the tool's ``Mcp-Param-*`` header map and output schema from it instead of listing the
    server's tools before every call. A server that then reports a header mismatch gets a fresh
    ``tools/list`` and the call once more, as without it.
    """
    what = f"tools/call {name!r}"
    responses = _typed_input_responses(input_responses, what)
    known = _stored_tool(tool, name)

    async def op(client: Client, wire: Wire) -> Outcome:
        dropped = False
        if known is not None:
            _learn_tool(client, known)
        else:
            wire.method = "tools/list"
            _, dropped = await _list_all(client, wire, watch=name)
            wire.method = None
        if dropped:
            raise PermanentError(
                "invalid_tool_headers",
                f"tool {name!r} declares invalid x-mcp-header annotations, so it must not be called",
            )

        _prepare_output_check(client, name)

        async def once() -> Outcome:
            return await _call_once(
                client, wire, name, arguments, responses, request_state, what, limit, on_progress
            )

        try:
            return await once()
        except MCPError as exc:
            if exc.code != HEADER_MISMATCH:
                raise
            # The server saw other Mcp-Param-* headers than it expects: re-list and resend once.
            wire.method = "tools/list"
            await _list_all(client, wire)
            wire.method = None
            _prepare_output_check(client, name)
            return await once()

    limit = server.timeout if call_timeout is None else call_timeout
    outcome = await _operate(
        server,
        op,
        what=what,
        idempotency_key=idempotency_key,
        request_state=request_state,
        call_timeout=limit,
    )
    logger.debug("%s -> %s", what, type(outcome).__name__)
    return outcome


async def list_tools(server: ServerConfig) -> ToolList:
    """The tools the server lists (page after page, as many as the hub keeps: `toollist`), as received;
    tools with invalid ``x-mcp-header`` annotations or that cannot be stored are dropped. Schemas are
    stored verbatim and never dereferenced."""

    async def op(client: Client, wire: Wire) -> ToolList:
        tools, _ = await _list_all(client, wire)
        return tools

    return await _operate(server, op, what="tools/list")


async def discover_on(client: Client, wire: Wire) -> dict[str, Any]:
    """``server/discover`` on an open client pinned to 2026-07-28: the result JSON.

    Raises ``PermanentError("protocol_unsupported")`` when the server does not speak 2026-07-28.
    """
    what = "server/discover"
    not_modern = f"this server does not speak MCP {PROTOCOL_VERSION}"
    try:
        raw = await client.session.send_discover(PROTOCOL_VERSION)
    except MCPError as exc:
        if exc.code == UNSUPPORTED_PROTOCOL_VERSION:
            data = exc.data if isinstance(exc.data, dict) else {}
            named = data.get("supported")
            supported: list[Any] = named if isinstance(named, list) else []
            mutual = [v for v in MODERN_PROTOCOL_VERSIONS if v in supported]
            if not mutual:
                offered = listed(supported) or "no version it names"
                raise PermanentError(
                    "protocol_unsupported", f"{not_modern} (it offers {offered})", rpc_code=exc.code
                ) from None
            raw = await client.session.send_discover(mutual[-1])
        elif (exc.code in (METHOD_NOT_FOUND, INVALID_REQUEST) or wire.http.status in (400, 404, 405)) and (
            wire.http.status is None or wire.http.status < 500
        ):
            raise PermanentError(
                "protocol_unsupported",
                f"{not_modern} (server/discover failed with error {exc.code})",
                rpc_code=exc.code,
            ) from None
        else:
            raise
    try:
        result = mcp_types.DiscoverResult.model_validate(raw, by_name=False)
    except ValidationError as exc:
        raise PermanentError(
            "malformed_response", f"the server's answer to {what} is malformed: {validation_summary(exc)}"
        ) from None
    if not any(v in result.supported_versions for v in MODERN_PROTOCOL_VERSIONS):
        raise PermanentError(
            "protocol_unsupported", f"{not_modern} (it offers {listed(result.supported_versions)})"
        )
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def discover(server: ServerConfig) -> dict[str, Any]:
    """``server/discover``: the result JSON, suitable for `ServerConfig.discover`.

    Raises ``PermanentError("protocol_unsupported")`` when the server does not speak 2026-07-28.
    """
    return await _operate(server, discover_on, what="server/discover")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine of this module to completion from synchronous code (a Celery task): on the
    process's kept event loop in its main thread (`approvals.mcp_client.loop`)."""
    return loop.run(coro)
