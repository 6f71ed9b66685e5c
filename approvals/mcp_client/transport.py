"""Below the SDK session: what `approvals.mcp_client` sees and changes on the wire.

- `Wire`: fresh random JSON-RPC ids per request (the SDK numbers from 1 in every new client, so a
  round retried by another process would reuse the first round's id), the raw result of each
  answer (a missing ``resultType`` reaches the SDK as ``complete``), the HTTP status / content type /
  Retry-After of the POST that carried the request (never of the SDK's own GET or DELETE), and the
  ``Idempotency-Key`` header on ``tools/call``.
- `TeeTransport`: an SDK `Transport` wrapping ``streamable_http_client`` with a `Wire`.
- a log filter that keeps the SDK transport from logging whole messages (arguments, requestState).
"""

from __future__ import annotations

import copy
import logging
import secrets
from typing import Any

import httpx2
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

from approvals.mcp_client.wire import HttpFacts, parse_retry_after

_JS_SAFE_INT = 2**53 - 1


class QuietSdkTransportLog(logging.Filter):
    """Keep the SDK's transport from logging whole JSON-RPC messages (arguments, requestState) at
    DEBUG, the endpoint URL (it may carry credentials), or the body of an unparseable answer."""

    DROPPED = ("Sending client message", "SSE message", "Connecting to StreamableHTTP endpoint")
    STRIPPED = ("Error parsing JSON response", "Error parsing SSE message")

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.msg if isinstance(record.msg, str) else ""
        if text.startswith(self.DROPPED):
            return False
        if text.startswith(self.STRIPPED):
            record.exc_info = None
            record.exc_text = None
        return True


SDK_TRANSPORT_LOGGER = logging.getLogger("mcp.client.streamable_http")
if not any(isinstance(f, QuietSdkTransportLog) for f in SDK_TRANSPORT_LOGGER.filters):
    SDK_TRANSPORT_LOGGER.addFilter(QuietSdkTransportLog())


class Wire:
    """Everything one operation learns below the SDK session, and the few things it changes.

    - Outgoing requests get a fresh random JSON-RPC id (the SDK numbers from 1 in each new client,
      so a round retried by another process would reuse the first round's id); answers are mapped
      back to the session's ids.
    - Each result is kept verbatim (`last_result`); a result without ``resultType`` reaches the SDK
      as ``complete`` (the spec's default, which mcp 2.3.0 would reject).
    - The HTTP status, content type and Retry-After of the answer to the last POST that carried a request
      (`http`), which the SDK folds into generic JSON-RPC errors; and of the last ``tools/call`` POST
      (`call_http`, None until its answer's head arrived). Only such POSTs count: the GET the SDK sends to
      resume a broken SSE stream (2026-07-28 has none; the SDK still sends it), its handshake-era stream and
      its DELETE are not the request's answer, and their status never judges it.
    - The ``Idempotency-Key`` header on every ``tools/call`` POST.
    - Whether a ``tools/call`` left the hub (`call_sent`): set once the connection starts writing its
      request headers (an httpcore trace event), so a failure before that (the guard, DNS, connect,
      TLS) is known not to have reached the server, and one after it may have. Each ``tools/call`` POST
      starts unsent: the SDK sends one again only after the server refused the first (a redirect, -32022,
      -32020).
    """

    def __init__(self, idempotency_key: str | None) -> None:
        self.idempotency_key = idempotency_key
        self.call_sent = False
        # The method being sent when it is not the one the operation is named after (a tools/list before a
        # tools/call): failures name it.
        self.method: str | None = None
        self.http = HttpFacts()
        self.call_http: HttpFacts | None = None
        self.last_result: dict[str, Any] | None = None
        self._to_session: dict[Any, Any] = {}
        self._to_wire: dict[Any, Any] = {}
        self._next_id = secrets.randbelow(2**52) + 1

    def _mint(self) -> int:
        self._next_id += 1
        if self._next_id >= _JS_SAFE_INT:
            self._next_id = 1
        return self._next_id

    def outbound(self, item: SessionMessage) -> SessionMessage:
        msg = item.message
        if isinstance(msg, JSONRPCRequest):
            wire_id = self._mint()
            self._to_session[wire_id] = msg.id
            self._to_wire[msg.id] = wire_id
            return SessionMessage(msg.model_copy(update={"id": wire_id}), metadata=item.metadata)
        if isinstance(msg, JSONRPCNotification) and msg.method == "notifications/cancelled":
            params = dict(msg.params or {})
            if params.get("requestId") in self._to_wire:
                params["requestId"] = self._to_wire[params["requestId"]]
                return SessionMessage(msg.model_copy(update={"params": params}), metadata=item.metadata)
        return item

    def inbound(self, item: Any) -> Any:
        if not isinstance(item, SessionMessage):
            return item
        msg = item.message
        if not isinstance(msg, JSONRPCResponse | JSONRPCError) or msg.id not in self._to_session:
            return item
        session_id = self._to_session.pop(msg.id)
        self._to_wire.pop(session_id, None)
        if isinstance(msg, JSONRPCError):
            return SessionMessage(JSONRPCError(jsonrpc="2.0", id=session_id, error=msg.error), item.metadata)
        self.last_result = copy.deepcopy(msg.result)
        result = msg.result if "resultType" in msg.result else {**msg.result, "resultType": "complete"}
        return SessionMessage(JSONRPCResponse(jsonrpc="2.0", id=session_id, result=result), item.metadata)

    @staticmethod
    def _carries_request(request: httpx2.Request) -> bool:
        """A POST of a JSON-RPC request (or, on a handshake-era session, of any message): what an answer's
        status judges. Not the SDK's GET (a stream, a reconnect) or DELETE, nor a notification's POST."""
        method = request.headers.get("mcp-method") or ""
        return request.method == "POST" and not method.startswith("notifications/")

    async def on_request(self, request: httpx2.Request) -> None:
        if not self._carries_request(request):
            return
        self.http = HttpFacts()
        if request.headers.get("mcp-method") == "tools/call":
            self.call_sent = False
            self.call_http = None
            if self.idempotency_key is not None:
                request.headers["Idempotency-Key"] = self.idempotency_key
            request.extensions["trace"] = self._trace_call

    async def _trace_call(self, event: str, info: dict[str, Any]) -> None:
        # "http11.send_request_headers.started" (or http2's): from here the server may see the call.
        if event.endswith("send_request_headers.started"):
            self.call_sent = True

    async def on_response(self, response: httpx2.Response) -> None:
        request = response.request
        if not self._carries_request(request):
            return
        self.http = HttpFacts(
            status=response.status_code,
            content_type=response.headers.get("content-type"),
            retry_after=parse_retry_after(response.headers.get("retry-after")),
        )
        if request.headers.get("mcp-method") == "tools/call":
            self.call_http = self.http


class ReadTee:
    """The transport's read stream, passed through `Wire.inbound`."""

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        return self._wire.inbound(await self._inner.receive())

    def __aiter__(self) -> ReadTee:
        return self

    async def __anext__(self) -> Any:
        return self._wire.inbound(await self._inner.__anext__())

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> ReadTee:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)


class WriteTee:
    """The transport's write stream, passed through `Wire.outbound`."""

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(self._wire.outbound(item))

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> WriteTee:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)


class TeeTransport:
    """An SDK `Transport` wrapping ``streamable_http_client`` with a `Wire`."""

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    async def __aenter__(self) -> tuple[ReadTee, WriteTee]:
        read, write = await self._inner.__aenter__()
        return ReadTee(read, self._wire), WriteTee(write, self._wire)

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)
