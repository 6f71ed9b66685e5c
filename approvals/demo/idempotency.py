"""`Idempotency-Key` support for POSTs to the MCP endpoint.

The hub re-sends a round only when a crash left its outcome unknown, always with the same key.
The first answer for a key is kept (in memory, bounded in count and in bytes: the oldest answers go
first) and replayed to any later request with that key, so the tool runs once; a request arriving
while the first is still running waits for it. Only a 2026-07-28 request has such an answer: a
handshake-era call's answer is an event stream on its session (with the server's questions in it),
which cannot be held back until the call ends, nor replayed.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from approvals.demo._asgi import (
    CapturedResponse,
    buffer_body,
    capture,
    handshake_era,
    header,
    is_mcp_post,
    json_body,
)

REPLAY_HEADER = (b"idempotent-replayed", b"true")
# Each answer (and request fingerprint) is at most a few MiB, the request body limit: without a bound in bytes
# as well, the count alone would let a client keep gigabytes here.
MAX_STORED_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class _Stored:
    fingerprint: str
    response: CapturedResponse


class IdempotencyStore:
    def __init__(self, max_entries: int = 1024, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._answers: OrderedDict[str, _Stored] = OrderedDict()
        self._bytes = 0
        self._running: dict[str, anyio.Event] = {}

    def clear(self) -> None:
        self._answers.clear()
        self._bytes = 0

    async def settled(self, key: str) -> _Stored | None:
        """The stored answer for `key` once no request with that key is running."""
        while (running := self._running.get(key)) is not None:
            await running.wait()
        return self._answers.get(key)

    async def first(
        self, key: str, fingerprint: str, run: Callable[[], Awaitable[CapturedResponse]]
    ) -> CapturedResponse:
        """Run the first request for `key` and keep its answer; a failure stores nothing."""
        done = self._running[key] = anyio.Event()
        try:
            response = await run()
            self._keep(key, _Stored(fingerprint, response))
        finally:
            del self._running[key]
            done.set()
        return response

    def _keep(self, key: str, stored: _Stored) -> None:
        self._answers[key] = stored
        self._bytes += _size(stored)
        while len(self._answers) > self.max_entries or self._bytes > self.max_bytes:
            _, dropped = self._answers.popitem(last=False)
            self._bytes -= _size(dropped)


def _size(stored: _Stored) -> int:
    return len(stored.fingerprint) + len(stored.response.body)


class IdempotencyMiddleware:
    def __init__(self, app: ASGIApp, store: IdempotencyStore) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = header(scope, "idempotency-key") if is_mcp_post(scope) and not handshake_era(scope) else None
        if not key:
            await self.app(scope, receive, send)
            return
        receive = await buffer_body(scope, receive)
        body = json_body(scope)
        if not isinstance(body, dict) or body.get("method") == "subscriptions/listen":
            # A notification stream has no single answer to keep.
            await self.app(scope, receive, send)
            return
        fingerprint = _fingerprint(body)
        stored = await self.store.settled(key)
        if stored is None:
            response = await self.store.first(key, fingerprint, lambda: capture(self.app, scope, receive))
        elif stored.fingerprint != fingerprint:
            response = _conflict(body.get("id"))
        else:
            response = _for_request(stored.response, body.get("id"))
        await response.send_to(send)


def _fingerprint(body: dict[str, Any]) -> str:
    """What must match for two requests to be the same: method and params, not id or `_meta`."""
    params = body.get("params")
    if isinstance(params, dict):
        params = {name: value for name, value in params.items() if name != "_meta"}
    return json.dumps({"method": body.get("method"), "params": params}, sort_keys=True)


def _for_request(response: CapturedResponse, request_id: Any) -> CapturedResponse:
    """The stored answer, addressed to this request's JSON-RPC id so the client can match it."""
    try:
        message = json.loads(response.body)
    except ValueError:
        message = None
    body = response.body
    if isinstance(message, dict) and "id" in message and message["id"] != request_id:
        body = json.dumps({**message, "id": request_id}, separators=(",", ":")).encode()
    headers = [(name, value) for name, value in response.headers if name.lower() != b"content-length"]
    headers += [(b"content-length", str(len(body)).encode()), REPLAY_HEADER]
    return replace(response, headers=headers, body=body)


def _conflict(request_id: Any) -> CapturedResponse:
    error = {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": -32602, "message": "Idempotency-Key was already used for a different request"},
    }
    body = json.dumps(error, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return CapturedResponse(422, headers, body)
