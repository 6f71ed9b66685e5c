"""A handshake-era MCP server whose tools ask through ``ctx.elicit()`` (run as a subprocess).

    python tests/push_server.py PORT [--wait SECONDS]

Built on the official SDK (`MCPServer`, ``mcp`` 2.3) served over Streamable HTTP with sessions, by uvicorn
on 127.0.0.1:PORT. Its elicitations are server-to-client ``elicitation/create`` requests sent in the middle of
``tools/call``, so they only work on a handshake-era connection. ``--wait`` is how long a tool waits for an
answer before it gives up (default 60 s).

- ``ask(question)``: a form elicitation; returns what the person typed, or that they declined / cancelled,
  or that it stopped waiting.
- ``ask_url()``: a url-mode elicitation (``ctx.elicit_url``).
- ``needs_auth()``: refuses with ``URLElicitationRequiredError`` (-32042) until ``POST /_authorize``.
- ``count_steps(steps)``: reports progress, then returns.
- ``grow()``: adds a destructive tool ``wipe`` and sends ``notifications/tools/list_changed``.
- ``echo(text)``, ``slow(seconds)``.
- ``GET /_counts``: how many times each tool ran (``tools/call`` received); ``slow.cancelled``: how many
  ``slow`` runs were stopped before their end; ``method:NAME``: how many JSON-RPC requests named NAME came.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp_types import ElicitRequestURLParams, ToolAnnotations
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from approvals.demo._asgi import buffer_body, is_mcp_post, json_body

COUNTS: Counter[str] = Counter()
STATE: dict[str, Any] = {"wait": 60.0, "authorized": False}

mcp = MCPServer("push-test-server", version="1.0.0")


class Answer(BaseModel):
    text: str = Field(description="Your answer")


@mcp.tool()
async def ask(question: str, ctx: Context) -> str:
    """Ask a person a question through elicitation/create, and return what they said."""
    COUNTS["ask"] += 1
    with anyio.move_on_after(STATE["wait"]) as waited:
        result = await ctx.elicit(question, Answer)
    if waited.cancelled_caught:
        return "stopped waiting"
    if result.action == "accept":
        return f"accepted: {result.data.text}"
    return result.action + "d" if result.action == "decline" else "cancelled"


@mcp.tool()
async def ask_url(ctx: Context) -> str:
    """Send the person to a URL (url-mode elicitation)."""
    COUNTS["ask_url"] += 1
    with anyio.move_on_after(STATE["wait"]) as waited:
        result = await ctx.elicit_url("Sign in to the test service", "https://example.com/sign-in", "el-1")
    if waited.cancelled_caught:
        return "stopped waiting"
    return f"url {result.action}"


@mcp.tool()
async def needs_auth() -> str:
    """Refuse with -32042 until the person has been to the URL."""
    COUNTS["needs_auth"] += 1
    if not STATE["authorized"]:
        raise UrlElicitationRequiredError(
            [
                ElicitRequestURLParams(
                    message="Authorize access to your files",
                    url="https://example.com/authorize",
                    elicitation_id="auth-1",
                )
            ]
        )
    return "authorized work done"


@mcp.tool()
async def count_steps(steps: int, ctx: Context) -> str:
    """Report progress for each step."""
    COUNTS["count_steps"] += 1
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step}")
        await anyio.sleep(0.05)
    return f"{steps} steps"


def wipe(target: str) -> str:
    """Delete the target (added by ``grow``)."""
    return f"wiped {target}"


@mcp.tool()
async def grow(ctx: Context) -> str:
    """Add the ``wipe`` tool (destructive) and tell the client its tool list changed."""
    COUNTS["grow"] += 1
    mcp.add_tool(wipe, annotations=ToolAnnotations(destructiveHint=True))
    await ctx.session.send_tool_list_changed()
    await anyio.sleep(0.5)
    return "grown"


@mcp.tool()
def echo(text: str) -> str:
    """Return the text."""
    COUNTS["echo"] += 1
    return f"echo: {text}"


@mcp.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    COUNTS["slow"] += 1
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        COUNTS["slow.cancelled"] += 1  # the client sent notifications/cancelled (or the session ended)
        raise
    return f"slept {seconds}"


class CountMethods:
    """Pure ASGI: count each JSON-RPC request's method on its way to the SDK's app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_mcp_post(scope):
            receive = await buffer_body(scope, receive)
            body = json_body(scope)
            if isinstance(body, dict) and isinstance(body.get("method"), str):
                COUNTS[f"method:{body['method']}"] += 1
        await self.app(scope, receive, send)


async def counts(request: Request) -> JSONResponse:
    return JSONResponse(dict(COUNTS))


async def authorize(request: Request) -> JSONResponse:
    STATE["authorized"] = True
    return JSONResponse({"ok": True})


def main() -> None:
    port = int(sys.argv[1])
    if "--wait" in sys.argv:
        STATE["wait"] = float(sys.argv[sys.argv.index("--wait") + 1])
    inner = mcp.streamable_http_app(json_response=False, stateless_http=False)
    app = Starlette(
        routes=[
            Route("/_counts", counts),
            Route("/_authorize", authorize, methods=["POST"]),
            Mount("/", app=CountMethods(inner)),
        ],
        lifespan=lambda app: inner.router.lifespan_context(inner),
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
