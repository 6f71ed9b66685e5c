"""Below the SDK session: what `approvals.mcp_client` sees and changes on the wire.

- `Wire`: fresh random JSON-RPC ids per request (the SDK numbers from 1 in every new client, so a
  round retried by another process would reuse the first round's id), the raw result of each
  answer (a missing ``resultType`` reaches the SDK as ``complete``), the HTTP status / content type /
  Retry-After of the POST that carried the request (never of the SDK's own GET or DELETE), and the
  ``Idempotency-Key`` header on ``tools/call``.
- `TeeTransport`: an SDK `Transport` wrapping `http_stream` with a `Wire`.
- `OwnAnswersTransport`: the SDK's Streamable HTTP transport, refusing what cannot be a request's answer
  (another request's id on its SSE stream, a result and an error at once).
- log filters that keep the SDK transport from logging whole messages (arguments, requestState), and every
  line the SDK logs short.
"""

from __future__ import annotations

import copy
import json
import logging
import secrets
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp_types import (
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
)

from approvals import netguard
from approvals.mcp_client.wire import HttpFacts, parse_retry_after

_JS_SAFE_INT = 2**53 - 1
# The error an answer naming another request's id becomes (`Wire.inbound`, `OwnAnswersTransport`): a
# malformed answer (`wire`).
ANOTHER_ID = "Failed to parse the answer: it names another request's id"
MAX_SAID = 1000  # characters of a server's error message kept for classifying it (it is scrubbed when shown)


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


MAX_LOGGED = 1000  # characters of one line the SDK logs


class BoundedSdkLog(logging.Filter):
    """Keep each line the SDK logs short: many quote a server's answer (the name of a tool it drops, of an SSE
    event, of a method), which the server chooses, and which may be megabytes long."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # the record's own problem: logged as it would be
            return True
        if len(text) > MAX_LOGGED:
            record.msg = text[:MAX_LOGGED] + "... (shortened)"
            record.args = None
        return True


SDK_TRANSPORT_LOGGER = logging.getLogger("mcp.client.streamable_http")
if not any(isinstance(f, QuietSdkTransportLog) for f in SDK_TRANSPORT_LOGGER.filters):
    SDK_TRANSPORT_LOGGER.addFilter(QuietSdkTransportLog())
# The SDK's loggers: its client session logs as "client".
for _name in ("mcp.client.streamable_http", "client", "mcp.shared.jsonrpc_dispatcher"):
    _sdk_logger = logging.getLogger(_name)
    if not any(isinstance(f, BoundedSdkLog) for f in _sdk_logger.filters):
        _sdk_logger.addFilter(BoundedSdkLog())


class Wire:
    """Everything one operation learns below the SDK session, and the few things it changes.

    - Outgoing requests get a fresh random JSON-RPC id (the SDK numbers from 1 in each new client,
      so a round retried by another process would reuse the first round's id); answers are mapped
      back to the session's ids.
    - Each result is kept verbatim (`last_result`); a result without ``resultType`` reaches the SDK
      as ``complete`` (the spec's default, which mcp 2.3.0 would reject).
    - With one request in flight, an answer naming none of ours answers it: a JSON-RPC error with a null id
      (JSON-RPC's answer when the server could not read the request's id) as that error; any other as a
      malformed answer. The SDK would drop it, and the request wait out its time limit.
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
        if isinstance(msg, JSONRPCResponse | JSONRPCError) and msg.id not in self._to_session:
            if len(self._to_session) != 1:
                return item
            # With one request in flight, an answer naming no request of ours is that request's: the SDK
            # would drop it, and the request wait out its time limit. A null id is JSON-RPC's answer to a
            # request whose id the server could not read; another id is an answer the hub cannot trust.
            pending = next(iter(self._to_session))
            if isinstance(msg, JSONRPCError) and msg.id is None:
                msg = JSONRPCError(jsonrpc="2.0", id=pending, error=msg.error)
            else:
                msg = JSONRPCError(
                    jsonrpc="2.0", id=pending, error=ErrorData(code=PARSE_ERROR, message=ANOTHER_ID)
                )
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
    def _method(request: httpx2.Request) -> str | None:
        """The JSON-RPC method a POST carries: its ``Mcp-Method`` header (2026-07-28), else, on a
        handshake-era session (whose requests carry no such header), the ``method`` of the JSON body the SDK
        wrote. None for anything else: a GET or DELETE, a response (the answer to a server's elicitation), a
        batch."""
        if request.method != "POST":
            return None
        named = request.headers.get("mcp-method")
        if named is not None:
            return named
        try:
            body = json.loads(request.content)
        except (httpx2.RequestNotRead, ValueError, TypeError):
            return None
        method = body.get("method") if isinstance(body, dict) else None
        return method if isinstance(method, str) else None

    @classmethod
    def _carries_request(cls, request: httpx2.Request) -> bool:
        """A POST of a JSON-RPC request: what an answer's status judges. Not the SDK's GET (a stream, a
        reconnect) or DELETE, nor the POST of a notification or of an answer to the server's question."""
        method = cls._method(request)
        return method is not None and not method.startswith("notifications/")

    async def on_request(self, request: httpx2.Request) -> None:
        if not self._carries_request(request):
            return
        self.http = HttpFacts()
        if self._method(request) == "tools/call":
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
        content_type = response.headers.get("content-type")
        said_code, said = await _error_said(response) if response.status_code >= 400 else (None, None)
        self.http = HttpFacts(
            status=response.status_code,
            content_type=content_type,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            session=bool(request.headers.get("mcp-session-id")),
            said=said,
            said_code=said_code,
        )
        if self._method(request) == "tools/call":
            self.call_http = self.http


async def _error_said(response: httpx2.Response) -> tuple[int | None, str | None]:
    """The code and message of the JSON error an HTTP error status came with, read here (the body is bounded
    by the outbound guard, and kept for the SDK, which reads it next), or Nones. Never raises: this runs in
    the HTTP client's response hook, where an exception would lose the answer it came with."""
    if not (response.headers.get("content-type") or "").lower().startswith("application/json"):
        return None, None
    try:
        body = json.loads(await response.aread())
    except Exception:  # too large, cut off, not JSON: the SDK reports it as it would
        return None, None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None, None
    code = error.get("code")
    # A JSON-RPC code is an integer; a bool (an int in Python) or a float is not one.
    integer = isinstance(code, int) and not isinstance(code, bool) and abs(code) <= _JS_SAFE_INT
    known = code if integer else None
    return known, error["message"][:MAX_SAID]


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


class InflatingTransport(httpx2.AsyncBaseTransport):
    """Decompresses a server's gzip or deflate answer itself, bounded as the outbound guard bounds what
    arrives (``ELICIT_MAX_MCP_RESPONSE``), and hands it on as plain bytes.

    The guard counts the bytes that arrive; the HTTP client decompresses after it, with no bound, so a
    compressed answer of a few hundred kilobytes (a "gzip bomb") would be read as hundreds of megabytes. An
    event stream is left to the client: it decompresses in bounded pieces, and the SDK bounds each event.
    Stacked codings ("gzip, gzip") are undone one by one, each bounded; a coding the hub did not offer is not
    read."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        # Only the codings decompressed here, bounded: a brotli or zstd decoder installed later would
        # otherwise be offered, and decompress past the bound in the client.
        request.headers["Accept-Encoding"] = ACCEPTED_CODINGS
        response = await self._inner.handle_async_request(request)
        codings = _codings(response.headers)
        streamed = (response.headers.get("content-type") or "").lower().startswith("text/event-stream")
        if not codings or streamed:
            return response
        unknown = [coding for coding in codings if coding not in _WBITS]
        if unknown:
            # Not decompressed here, so not bounded: the client would decompress it (a "br" once a decoder is
            # installed) past the bound, or hand on bytes no one can read.
            await response.aclose()
            raise httpx2.DecodingError("the server's answer is in a content coding the hub did not offer")
        # The codings in the order applied ("gzip, gzip": gzipped twice) are undone last first, each bounded.
        stream: Any = response.stream
        for coding in reversed(codings):
            stream = _Inflated(stream, coding, netguard.max_response())
        response.stream = stream
        del response.headers["content-encoding"]
        if "content-length" in response.headers:
            del response.headers["content-length"]
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


ACCEPTED_CODINGS = "gzip, deflate"

# zlib's window bits per content coding: a gzip member; a zlib stream ("deflate" as HTTP means it).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class _Inflated(httpx2.AsyncByteStream):
    """A compressed body, decompressed; `netguard.ResponseTooLarge` once more than `limit` bytes come out."""

    def __init__(self, inner: Any, coding: str, limit: int) -> None:
        self._inner, self._coding, self._limit = inner, coding, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        inflater: Any = None
        seen = 0
        try:
            async for chunk in self._inner:
                if inflater is None:
                    if not chunk:
                        continue
                    wbits = _WBITS[self._coding]
                    if self._coding == "deflate" and not _zlib_header(chunk):
                        wbits = -zlib.MAX_WBITS  # some servers send a raw deflate stream for "deflate"
                    inflater = zlib.decompressobj(wbits)
                data = chunk
                while data:
                    # At most one byte past the limit comes out of each step, however much it would expand.
                    out = inflater.decompress(data, self._limit + 1 - seen)
                    data = inflater.unconsumed_tail
                    seen += len(out)
                    if seen > self._limit:
                        raise netguard.ResponseTooLarge(self._limit)
                    if out:
                        yield out
        except zlib.error:
            raise httpx2.DecodingError("the server's compressed answer is corrupt") from None
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        await self._inner.aclose()


def _codings(headers: httpx2.Headers) -> list[str]:
    """The content codings of an answer, in the order the server applied them, as the HTTP client reads them
    (every Content-Encoding header, split at commas), without "identity"."""
    found = [item.strip().lower() for item in headers.get_list("content-encoding", split_commas=True)]
    return [coding for coding in found if coding and coding != "identity"]


def _zlib_header(data: bytes) -> bool:
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class OwnAnswersTransport(StreamableHTTPTransport):
    """The SDK's Streamable HTTP transport, except that what cannot be a request's answer is not taken for it.

    - An answer on a request's SSE stream that names another request's id: the SDK gives every answer on a
      request's stream the request's id, whatever id it names (meant for a replayed stream), so another
      request's result (a proxy that mixed up two streams, a server answering from the wrong state) would be
      taken for this call's. It is a malformed answer instead, as a JSON answer naming another id is
      (`Wire.inbound`). An error with a null id (JSON-RPC's answer to a request whose id the server could not
      read) is still the request's.
    - An answer carrying both a result and an error (JSON-RPC allows exactly one): the SDK reads it as the
      error, and the call as refused, when the result says the tool ran. It is a malformed answer instead.
    """

    async def _handle_sse_event(
        self,
        sse: httpx2.ServerSentEvent,
        read_stream_writer: Any,
        original_request_id: RequestId | None = None,
        resumption_callback: Callable[[str], Awaitable[None]] | None = None,
    ) -> bool:
        if original_request_id is not None and sse.event == "message" and sse.data:
            problem = answer_problem(sse.data, original_request_id)
            if problem is not None:
                error = JSONRPCError(
                    jsonrpc="2.0", id=original_request_id, error=ErrorData(code=PARSE_ERROR, message=problem)
                )
                data = error.model_dump_json(by_alias=True, exclude_none=True)
                sse = httpx2.ServerSentEvent(event=sse.event, data=data, id=sse.id, retry=sse.retry)
        return await super()._handle_sse_event(
            sse, read_stream_writer, original_request_id, resumption_callback
        )

    async def _handle_json_response(
        self, response: httpx2.Response, read_stream_writer: Any, *, request_id: RequestId
    ) -> None:
        try:
            content = await response.aread()
        except httpx2.StreamError as exc:
            # What the SDK does with an answer it cannot read (it cannot be read twice).
            error = ErrorData(code=PARSE_ERROR, message=f"Failed to parse JSON response: {exc}")
            await read_stream_writer.send(
                SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
            )
            return
        # Another id is judged by `Wire.inbound`, which knows the requests in flight.
        problem = answer_problem(content, None)
        if problem is not None:
            error = ErrorData(code=PARSE_ERROR, message=problem)
            await read_stream_writer.send(
                SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
            )
            return
        await super()._handle_json_response(response, read_stream_writer, request_id=request_id)


# The error an answer carrying both a result and an error becomes (`OwnAnswersTransport`): a malformed answer.
RESULT_AND_ERROR = "Failed to parse the answer: it carries both a result and an error"


def answer_problem(data: str | bytes, request_id: RequestId | None) -> str | None:
    """Why a JSON-RPC answer (JSON text) to request `request_id` cannot be that request's answer: it carries
    both a result and an error (`RESULT_AND_ERROR`), or names another id (`ANOTHER_ID`; not judged when
    `request_id` is None; a null id is JSON-RPC's answer to a request whose id the server could not read).
    None for anything else, unreadable text included (the SDK reports that itself)."""
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or ("result" not in message and "error" not in message):
        return None
    if "result" in message and "error" in message:
        return RESULT_AND_ERROR
    named = message.get("id")
    if request_id is None or named is None:
        return None
    return ANOTHER_ID if type(named) is not type(request_id) or named != request_id else None


@asynccontextmanager
async def http_stream(url: str, http: httpx2.AsyncClient) -> AsyncIterator[Any]:
    """The SDK's Streamable HTTP transport to `url` on the hub's client `http` (``streamable_http_client``,
    with `OwnAnswersTransport`). It reads an event of an SSE answer up to the size the hub reads of any answer
    (``ELICIT_MAX_MCP_RESPONSE``), not the SDK's 1 MiB: a result is as large in an event stream as in a JSON
    answer, and one cut short is lost after the tool ran."""
    transport = OwnAnswersTransport(url, max_sse_event_size=netguard.max_response())
    read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_stream_reader = create_context_streams[SessionMessage](0)
    async with (
        read_stream_writer,
        read_stream,
        write_stream,
        write_stream_reader,
        anyio.create_task_group() as tg,
    ):

        def start_get_stream() -> None:
            tg.start_soon(transport.handle_get_stream, http, read_stream_writer)

        tg.start_soon(
            transport.post_writer,
            http,
            write_stream_reader,
            read_stream_writer,
            write_stream,
            start_get_stream,
            tg,
        )
        try:
            yield read_stream, write_stream
        finally:
            if transport.session_id:
                await transport.terminate_session(http)
            tg.cancel_scope.cancel()


class TeeTransport:
    """An SDK `Transport` wrapping `http_stream` with a `Wire`."""

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    async def __aenter__(self) -> tuple[ReadTee, WriteTee]:
        read, write = await self._inner.__aenter__()
        return ReadTee(read, self._wire), WriteTee(write, self._wire)

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)
