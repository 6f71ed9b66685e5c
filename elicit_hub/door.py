"""What every web server of the hub checks at the door, before Django sees a request.

- **A body over ELICIT_MAX_BODY is refused before it is stored.** :class:`BodyLimit` (ASGI) answers 413 from
  the ``Content-Length`` header alone, or as soon as a body sent in chunks passes the limit, and closes the
  connection; the application never sees the request. Below the limit it hands the application the whole
  body at once. Django's handler would otherwise spool any body, however large, to a temporary file before
  the hub's ``BodyLimitMiddleware`` could look at it. Daphne needs the same check inside Twisted, which
  collects a body before the application runs (``elicit_hub.serve``); both answer with :func:`refusal`.
- **A body that stops coming is answered 408.** Each piece of a body must come within ``timeout`` seconds of
  the one before (ELICIT_CLIENT_TIMEOUT): a client that declared a length and then sent nothing, or a byte
  now and then, held its request open (its connection, and the body so far in memory) for ever.
- A refusal has the API's shape under /api/ (JSON with a code and a message) and is a short page elsewhere
  (:func:`answer`), with the security headers the application's answers carry (:data:`SECURITY_HEADERS`):
  no middleware runs on it.
"""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # (scope, receive, send); Django's handler types them its own way


# What SecurityMiddleware, the CSP middleware and XFrameOptionsMiddleware add to the application's answers; a
# refusal needs nothing from anywhere (no script, style or image), so its policy allows nothing.
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", b"default-src 'none'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


def json_error(code: str, message: str) -> tuple[bytes, bytes]:
    """The content type and body of the API's JSON error (``code``, ``message``)."""
    return b"application/json", json.dumps({"error": {"code": code, "message": message}}).encode()


def answer(path: str, code: str, title: str, message: str) -> tuple[bytes, bytes]:
    """The content type and body of a refusal at the door: the API's JSON error (``code``, ``message``)
    under /api/, a short readable page elsewhere."""
    if path.startswith("/api/"):
        return json_error(code, message)
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"</head><body><h1>{html.escape(title)}</h1><p>{html.escape(message)} "
        '<a href="/">Back to the queue</a></p></body></html>'
    )
    return b"text/html; charset=utf-8", page.encode()


def refusal(path: str, limit: int) -> tuple[bytes, bytes]:
    """The content type and body of the 413 answer to a request for `path`."""
    from approvals.middleware import too_large_error

    if path.startswith("/api/"):
        return b"application/json", json.dumps(too_large_error(limit)).encode()
    return answer(
        path,
        "body_too_large",
        "Too much to send",
        f"What you sent is larger than {limit} bytes, the most the hub accepts in one request. "
        "Nothing was recorded.",
    )


def raw_response(status_line: bytes, kind: bytes, body: bytes) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for a server to write before any application
    runs (``status_line`` ends with CRLF)."""
    headers = [(b"Content-Type", kind), (b"Content-Length", str(len(body)).encode()), *SECURITY_HEADERS]
    head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return status_line + head + b"Connection: close\r\n\r\n" + body


def too_slow(path: str, timeout: float) -> tuple[bytes, bytes]:
    """The content type and body of the 408 answer to a request for `path` whose body stopped coming."""
    message = f"The request's body stopped arriving: nothing for {timeout:g} seconds. Nothing was recorded."
    return answer(path, "request_timeout", "Too slow", message)


class TooLarge:
    """What `read_body` answers for a body over its limit."""


class TooSlow:
    """What `read_body` answers for a body that stopped coming."""


TOO_LARGE = TooLarge()
TOO_SLOW = TooSlow()


async def read_body(
    scope: Scope, receive: Receive, limit: int, timeout: float | None = None
) -> bytes | TooLarge | TooSlow | None:
    """A request's whole body; TOO_LARGE as soon as it is known to pass `limit` bytes (its declared length,
    before anything is read: no "100 Continue" is sent, or as it arrives); TOO_SLOW when no piece of it came
    for `timeout` seconds; None when the client left before its body was in (nobody to answer)."""
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if declared.isdigit() and int(declared) > limit:
        return TOO_LARGE
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), timeout)
        except TimeoutError:
            return TOO_SLOW
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, then what comes after it (the client's disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


class BodyLimit:
    """ASGI middleware: HTTP request bodies over `limit` bytes are answered 413, and bodies of which nothing
    came for `timeout` seconds 408; neither reaches `app`."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float | None = None) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.limit:
            await self.app(scope, receive, send)
            return
        body = await read_body(scope, receive, self.limit, self.timeout)
        if body is TOO_LARGE:
            await self._refuse(send, 413, refusal(scope["path"], self.limit))
        elif body is TOO_SLOW:
            await self._refuse(send, 408, too_slow(scope["path"], self.timeout or 0))
        elif isinstance(body, bytes):
            await self.app(scope, replay(body, receive), send)

    @staticmethod
    async def _refuse(send: Send, status: int, content: tuple[bytes, bytes]) -> None:
        kind, body = content
        headers = [
            (b"content-type", kind),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is not wanted
            *SECURITY_HEADERS,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
