"""Handshake-era sessions: one open `mcp.Client` that a server may ask things on, mid-call.

On a handshake-era connection (``initialize``, ``Mcp-Session-Id``) a server that needs a person sends
``elicitation/create`` in the middle of ``tools/call`` and waits on the open stream; the answer goes back on
the same session. This module opens such clients and runs calls on them; the holder process keeps them open
while people decide. Pure: no Django.

    dispatcher = Dispatcher()
    transport, http = http_transport(server, read_timeout=limit)
    async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=30) as client:
        outcome = await call_on(client, dispatcher, hooks, "deploy", {"branch": "main"}, timeout=limit)

- `SessionHooks`: what the call running on a session now wants to hear (elicitations, progress, a changed
  tool list). `Dispatcher` routes the SDK's callbacks of one client to the hooks of the call on it now
  (``dispatcher.hooks``), so a long-lived stdio session serves one call after another.
- The hub's own time limit on a call stops running while an elicitation waits for a person: only the
  server decides how long it waits (its deadline is shown to reviewers).
- A ``URLElicitationRequiredError`` (-32042) becomes a `UrlRequired` outcome: the person opens the URL(s),
  then the call may be re-sent if that is safe.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.shared.exceptions import MCPError
from mcp_types import URL_ELICITATION_REQUIRED

from approvals import netguard
from approvals.mcp_client.client import (
    CLIENT_INFO,
    _check_url,
    _classify,
    _guarded_http,
    _learn_tool,
    _prepare_output_check,
    _secrets,
    _stored_tool,
    after_send,
    teach_first,
)
from approvals.mcp_client.outcomes import (
    Completed,
    McpError,
    PermanentError,
    ServerConfig,
    ToolError,
    TransientError,
)
from approvals.mcp_client.toollist import ToolList
from approvals.mcp_client.transport import Wire, http_stream
from approvals.mcp_client.wire import read_call_result, scrub

logger = logging.getLogger(__name__)

Mode = Literal["auto", "legacy"]
# The SDK's per-request read timeout must never cut a call while a person decides: the hub's own limit
# (which pauses during elicitations) bounds it instead.
_NO_SDK_TIMEOUT = 365 * 24 * 3600.0
MAX_URL_ELICITATIONS = 20


async def _ignore_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


async def _ignore() -> None:
    return None


@dataclass
class SessionHooks:
    """What one call wants to hear from the session it runs on.

    `elicit` gets the ``elicitation/create`` params as JSON and returns the ElicitResult JSON
    (``{"action": "accept" | "decline" | "cancel", "content"?: {...}}``); it may wait as long as the server
    does. If the server cancels the request (or the session ends) the awaiting task is cancelled.
    """

    elicit: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    progress: Callable[[float, float | None, str | None], Awaitable[None]] = _ignore_progress
    tools_changed: Callable[[], Awaitable[None]] = _ignore


@dataclass(frozen=True)
class UrlRequired:
    """The server refused the call with -32042: a person must open these URLs, then it may be re-sent.

    `elicitations` are the url-mode elicitation params as JSON (``mode``, ``message``, ``url``,
    ``elicitationId``)."""

    elicitations: list[dict[str, Any]]
    message: str


SessionOutcome = Completed | ToolError | UrlRequired


class Dispatcher:
    """Routes the SDK callbacks of one open client to the `SessionHooks` of the call running on it now.

    `hooks` is switched per call (None between calls: an elicitation then is declined). `wire` carries the
    HTTP facts of the last exchange when the client speaks Streamable HTTP, for classifying failures;
    `secrets` are scrubbed from error messages.
    """

    def __init__(self, *, wire: Wire | None = None, secrets: list[str] | None = None) -> None:
        self.hooks: SessionHooks | None = None
        self.wire = wire or Wire(None)
        self.secrets = list(secrets or [])
        self.pending = 0  # elicitations waiting for a person now
        # Set by `http_transport`: requests go out as HTTP POSTs, whose answers `wire` records. Otherwise (a
        # stdio server) a request handed to the session is written to the server.
        self.over_http = False
        # What the check of the last result against its output schema found (`_keep_results`).
        self.output_problem: str | None = None
        # The call `call_on` is running ("tools/call 'deploy'") until it has its outcome. Over HTTP, where a
        # session serves one call, a failure that ends the whole client meanwhile (its transport broke
        # mid-answer) reaches `open_client`, not `call_on`: it names this call, and says whether the tool may
        # have run. (A stdio session outlives its calls, and runs in a task of its own: a call on it learns
        # of the end itself, its request failed as the connection closed.)
        self.calling: str | None = None
        self._limit: anyio.CancelScope | None = None
        self._remaining: float | None = None

    # ---- the hub's time limit, paused while a person decides ---------------------------------------

    def _pause(self) -> None:
        scope = self._limit
        if scope is not None and self._remaining is None and not math.isinf(scope.deadline):
            self._remaining = max(0.0, scope.deadline - anyio.current_time())
            scope.deadline = math.inf

    def _resume(self) -> None:
        scope = self._limit
        if scope is not None and self._remaining is not None and self.pending == 0:
            scope.deadline = anyio.current_time() + self._remaining
            self._remaining = None

    # ---- the SDK's callbacks -----------------------------------------------------------------------

    async def elicitation_callback(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        hooks = self.hooks
        if hooks is None:
            logger.warning("an elicitation arrived between calls; declined")
            return mcp_types.ElicitResult(action="decline")
        asked = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        self.pending += 1
        self._pause()
        try:
            answer = await hooks.elicit(asked)
        except Exception as exc:
            logger.exception("answering an elicitation failed")
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"the client could not answer: {type(exc).__name__}"
            )
        finally:
            self.pending -= 1
            self._resume()
        try:
            return mcp_types.ElicitResult.model_validate(answer, by_name=False)
        except ValueError:
            logger.error("an elicitation answer is malformed; cancelled instead")
            return mcp_types.ElicitResult(action="cancel")

    async def message_handler(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            logger.debug("session transport: %s", type(message).__name__)
            return
        hooks = self.hooks
        if isinstance(message, mcp_types.ToolListChangedNotification) and hooks is not None:
            try:
                await hooks.tools_changed()
            except Exception:
                logger.exception("handling notifications/tools/list_changed failed")

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        hooks = self.hooks
        if hooks is None:
            return
        try:
            await hooks.progress(progress, total, message)
        except Exception:
            logger.exception("recording progress failed")


# ---- opening a session -------------------------------------------------------------------------------


def http_transport(
    server: ServerConfig,
    *,
    read_timeout: float,
    dispatcher: Dispatcher | None = None,
    checked: netguard.Checked | None = None,
) -> tuple[Any, httpx2.AsyncClient]:
    """A Streamable HTTP transport for `server` on the hub's guarded HTTP client.

    Every request is sent to the address the outbound guard checked for its URL, once per session (as for
    2026-07-28 calls): the session's requests all reach the address it opened on. `checked` is that check
    when the caller made it already (`check_url`). `read_timeout` bounds an idle event stream: it must cover
    the call's time limit and the server's wait for an elicitation answer. Returns (transport, http client);
    the caller closes the client."""
    wire = dispatcher.wire if dispatcher is not None else Wire(None)
    if dispatcher is not None:
        dispatcher.secrets.extend(_secrets(server))
        dispatcher.over_http = True
    http = _guarded_http(server, wire, httpx2.Timeout(server.timeout, read=read_timeout), checked)
    return http_stream(server.url, http), http


async def check_url(url: str) -> netguard.Checked:
    """The outbound guard's verdict on a server URL before a session is opened (raises McpError)."""
    return await _check_url(url)


@asynccontextmanager
async def open_client(
    transport: Any, *, mode: Mode, dispatcher: Dispatcher, timeout: float
) -> AsyncIterator[Client]:
    """Open a client on `transport` (``initialize`` for ``legacy``; ``auto`` probes first), its callbacks
    routed through `dispatcher`. `timeout` bounds each request of the opening (and list/ping requests
    later); calls get their own, pausable limit in `call_on`. Failures to open raise an `McpError`."""
    client = Client(
        transport,
        mode=mode,
        client_info=CLIENT_INFO,
        elicitation_callback=dispatcher.elicitation_callback,
        message_handler=dispatcher.message_handler,
        read_timeout_seconds=timeout,
        cache=None,
    )
    inner: list[BaseException] = []
    try:
        async with client:
            _keep_results(client, dispatcher)
            try:
                yield client
            except BaseException as exc:
                inner.append(exc)  # the caller's own exception passes through untouched
                raise
    except BaseException as exc:
        leaves = _leaves(exc)
        mine = [leaf for leaf in leaves if any(leaf is own for own in inner)]
        if mine:
            raise mine[0] from None  # the caller's exception, unwrapped from the SDK's task groups
        cancelled = anyio.get_cancelled_exc_class()
        if all(isinstance(leaf, cancelled) for leaf in leaves) or not isinstance(exc, Exception):
            raise
        mcp_errors = [leaf for leaf in leaves if isinstance(leaf, McpError)]
        calling = dispatcher.calling if dispatcher.over_http else None
        error = (
            mcp_errors[0]
            if mcp_errors
            else _classify(exc, dispatcher.wire, calling or "initialize", dispatcher.secrets)
        )
        if calling is not None:
            # The client ended under a call in flight: once it left the hub, only the server's answer says
            # whether the tool ran.
            error = after_send(error, dispatcher.wire)
        raise error from None


def _keep_results(client: Client, dispatcher: Dispatcher) -> None:
    """SDK trap: ``ClientSession.call_tool`` checks a result against its tool's output schema and raises
    ``RuntimeError`` when it does not conform, after the tool has run, and the result is lost. On the hub's
    sessions the verdict is kept on the dispatcher instead (`Dispatcher.output_problem`) and the result comes
    back, so the call is recorded as completed with the problem noted, as on 2026-07-28."""
    session = client.session
    check = session.validate_tool_result

    async def judged(name: str, result: mcp_types.CallToolResult) -> None:
        try:
            await check(name, result)
        except RuntimeError as exc:
            dispatcher.output_problem = scrub(str(exc), dispatcher.secrets)

    session.validate_tool_result = judged  # type: ignore[method-assign]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


# ---- one call on an open session ---------------------------------------------------------------------


@dataclass
class _Limit:
    seconds: float
    hit: bool = field(default=False)


def _url_required(exc: MCPError, secrets: list[str]) -> UrlRequired:
    data = exc.data if isinstance(exc.data, dict) else {}
    raw = data.get("elicitations")
    found: list[dict[str, Any]] = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and isinstance(item.get("url"), str):
            found.append({**item, "mode": "url"})
    if not found:
        raise PermanentError(
            "malformed_response", "the server asked for a URL elicitation (-32042) but named no URL"
        )
    return UrlRequired(found[:MAX_URL_ELICITATIONS], scrub(str(exc.message or ""), secrets)[:1000])


async def call_on(
    client: Client,
    dispatcher: Dispatcher,
    hooks: SessionHooks,
    name: str,
    arguments: dict[str, Any] | None,
    *,
    timeout: float,
    idempotency_key: str | None = None,
    tool: dict[str, Any] | None = None,
) -> SessionOutcome:
    """Send ``tools/call`` `name` on the open `client` (with a progressToken) and wait for its outcome.

    `timeout` is the hub's limit on the call; it stops running while an elicitation waits for a person.
    Returns `Completed`, `ToolError` or `UrlRequired`; raises `McpError`. A limit that passes after the
    request left raises ``PermanentError("outcome_unknown")``: the tool may have run. Any other failure once
    the request left (its stream ended without the answer, an answer unreadable, a 5xx) has ``may_have_run``
    unless the server's answer proves it refused the call (`client.REFUSALS`) or says what became of it.

    `tool` is the tool's definition as the hub stores it (its server's tools/list): the session learns the
    tool's output schema from it. Without it, a session that has not listed the tools lists them before the
    call; the SDK would otherwise list them after the tool has run, to check its result, on every new
    session, and a failure there would lose a result already received."""
    what = f"tools/call {name!r}"
    await expect_output(client, dispatcher, name, tool, timeout=timeout)
    dispatcher.output_problem = None
    dispatcher.hooks = hooks
    dispatcher.wire.idempotency_key = idempotency_key
    dispatcher.wire.last_result = None
    dispatcher.wire.call_sent = False
    dispatcher.wire.call_http = None
    result: mcp_types.CallToolResult | None = None
    failure: BaseException | None = None
    dispatcher.calling = what  # left set if the client ends under the call (`open_client` reports it)
    with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
        dispatcher._limit = scope
        try:
            result = await client.call_tool(
                name,
                arguments,
                read_timeout_seconds=_NO_SDK_TIMEOUT,
                progress_callback=dispatcher.on_progress,
            )
        except Exception as exc:
            failure = exc
        finally:
            dispatcher._limit = None
            dispatcher._remaining = None
            dispatcher.hooks = None
    dispatcher.calling = None
    if scope.cancelled_caught:
        raise PermanentError(
            "outcome_unknown",
            f"no answer to {what} within {timeout:g} s; the tool may have run, so it is not sent again",
        )
    if failure is not None:
        if isinstance(failure, MCPError) and failure.code == URL_ELICITATION_REQUIRED:
            return _url_required(failure, dispatcher.secrets)
        # Whether the tool may have run: once the call left the hub, only the server's answer says.
        error = _classify(failure, dispatcher.wire, what, dispatcher.secrets)
        raise after_send(error, dispatcher.wire, written=not dispatcher.over_http) from None
    assert result is not None
    try:
        outcome = read_call_result(result.model_dump(by_alias=True, mode="json", exclude_none=True), what)
        if not isinstance(outcome, Completed | ToolError):
            raise PermanentError("malformed_response", f"the server's answer to {what} is not a tool result")
    except McpError as exc:
        # The server answered, and the answer is lost: the tool may have run.
        raise after_send(exc, dispatcher.wire, written=not dispatcher.over_http) from None
    if isinstance(outcome, Completed) and dispatcher.output_problem is not None:
        return Completed(outcome.result, output_schema_error=dispatcher.output_problem)
    return outcome


async def expect_output(
    client: Client, dispatcher: Dispatcher, name: str, tool: dict[str, Any] | None, *, timeout: float
) -> None:
    """Before calling tool `name`: the session learns its output schema from its stored definition `tool`,
    or, when there is none and the session has not listed the tools, from a tools/list now, bounded by
    `timeout` (raises `McpError`; the call has not been sent). The validator is this process's compiled one.
    `call_on` does this itself; a caller that records the send first does it before, so that a failure to
    list is not taken for a call that may have run. A session that knows the tool already (from an earlier
    call of this, or from its own listing) learns nothing again."""
    if name not in client.session._tool_output_schemas:
        known = _stored_tool(tool, name)
        if known is not None:
            _learn_tool(client, known)
        else:
            try:
                await list_tools_on(client, timeout=timeout)
            except Exception as exc:
                raise _classify(exc, dispatcher.wire, "tools/list", dispatcher.secrets) from None
    _prepare_output_check(client, name)


async def list_tools_on(client: Client, *, timeout: float) -> ToolList:
    """The tools the server lists on this open session (page after page, as many as the hub keeps:
    `toollist`), as JSON."""
    tools = ToolList()
    again: set[str] = set()  # names listed more than once, whose first definition the hub kept
    cursor: str | None = None
    pages = 0
    with anyio.fail_after(timeout):
        while True:
            page = await client.list_tools(cursor=cursor)
            pages += 1
            for tool in page.tools:
                before = tools.duplicates
                if not tools.offer(tool.model_dump(by_alias=True, mode="json", exclude_none=True)):
                    break
                if tools.duplicates > before:
                    again.add(tool.name)
            if not tools.more(page.next_cursor, pages):
                break
            cursor = page.next_cursor
    # The session absorbed the last definition of each name listed twice: its calls check results and send
    # headers by the first, which the hub keeps.
    teach_first(client, tools, again)
    return tools


__all__ = [
    "Dispatcher",
    "McpError",
    "Mode",
    "PermanentError",
    "SessionHooks",
    "SessionOutcome",
    "TransientError",
    "UrlRequired",
    "call_on",
    "check_url",
    "expect_output",
    "http_transport",
    "list_tools_on",
    "open_client",
]
