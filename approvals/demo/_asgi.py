"""Pure-ASGI plumbing shared by the demo's middlewares.

Pure ASGI rather than Starlette's BaseHTTPMiddleware: a client that goes away must not cancel the
tool, because the tests that kill a client mid-request need the server to behave like a real one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from elicit_hub import door

MCP_PATH = "/mcp"
_BODY = "elicit_demo.body"
_JSON = "elicit_demo.json"


def is_mcp_post(scope: Scope) -> bool:
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"].rstrip("/") == MCP_PATH


def handshake_era(scope: Scope) -> bool:
    """Whether a request to /mcp belongs to the handshake era: it names one of its versions, or none (an
    `initialize`, or a client of 2025-03-26 that sends no version)."""
    version = header(scope, "mcp-protocol-version")
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


def header(scope: Scope, name: str) -> str | None:
    wanted = name.lower().encode("latin-1")
    for key, value in scope["headers"]:
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


async def buffer_body(scope: Scope, receive: Receive) -> Receive:
    """Read the request body once into the scope; return a `receive` that replays it downstream."""
    if _BODY in scope:
        return receive
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    scope[_BODY] = body
    try:
        scope[_JSON] = json.loads(body)
    except ValueError:
        scope[_JSON] = None
    return door.replay(body, receive)


def json_body(scope: Scope) -> Any:
    """The parsed JSON-RPC body buffered by `buffer_body` (None when it was not JSON)."""
    return scope.get(_JSON)


def tool_call(scope: Scope) -> dict[str, Any] | None:
    """The params of a buffered `tools/call` request, or None for anything else."""
    body = json_body(scope)
    if isinstance(body, dict) and body.get("method") == "tools/call" and isinstance(body.get("params"), dict):
        return body["params"]
    return None


@dataclass(frozen=True)
class CapturedResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    async def send_to(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


async def capture(app: ASGIApp, scope: Scope, receive: Receive) -> CapturedResponse:
    """Run `app` to completion and keep its whole response instead of sending it."""
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def keep(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, keep)
    return CapturedResponse(start["status"], list(start.get("headers", [])), b"".join(chunks))
