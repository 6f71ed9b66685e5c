"""What every web server of the hub checks at the door, before Django sees a request.

- **A body over ELICIT_MAX_BODY is refused before it is stored.** :class:`BodyLimit` (ASGI) answers 413 from
  the ``Content-Length`` header alone, or as soon as a body sent in chunks passes the limit, and closes the
  connection; the application never sees the request. Below the limit it hands the application the whole
  body at once. Django's handler would otherwise spool any body, however large, to a temporary file before
  the hub's ``BodyLimitMiddleware`` could look at it. Daphne needs the same check inside Twisted, which
  collects a body before the application runs (``elicit_hub.serve``); both answer with :func:`refusal`.
- A refusal has the API's shape under /api/ (JSON with a code and a message) and is a short page elsewhere
  (:func:`answer`).
"""

from __future__ import annotations

import html
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # (scope, receive, send); Django's handler types them its own way


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
    head = b"Content-Type: " + kind + b"\r\nContent-Length: " + str(len(body)).encode()
    return status_line + head + b"\r\nConnection: close\r\n\r\n" + body


class TooLarge:
    """What `read_body` answers for a body over its limit."""


TOO_LARGE = TooLarge()


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | TooLarge | None:
    """A request's whole body; TOO_LARGE as soon as it is known to pass `limit` bytes (its declared length,
    before anything is read: no "100 Continue" is sent, or as it arrives); None when the client left before
    its body was in (nobody to answer)."""
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if declared.isdigit() and int(declared) > limit:
        return TOO_LARGE
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
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
    """ASGI middleware: HTTP request bodies over `limit` bytes are answered 413 and never reach `app`."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.limit:
            await self.app(scope, receive, send)
            return
        body = await read_body(scope, receive, self.limit)
        if body is TOO_LARGE:
            await self._refuse(scope, send)
        elif isinstance(body, bytes):
            await self.app(scope, replay(body, receive), send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        kind, body = refusal(scope["path"], self.limit)
        headers = [
            (b"content-type", kind),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is not wanted
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
