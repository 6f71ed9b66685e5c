"""A handshake-era MCP server for the probe tests (run as a subprocess).

    python tests/handshake_server.py PORT
    python tests/handshake_server.py --stdio

The official SDK's `MCPServer` (mcp 2.3) served statefully over Streamable HTTP on 127.0.0.1:PORT/mcp,
behind a shim that hides its 2026-07-28 entry: a request naming a 2026-07-28 ``MCP-Protocol-Version``
reaches the session-bound handshake path, which answers 400 "Missing session ID" as servers built on
mcp 1.x (FastMCP 2.x) do. Tools: ``echo``, ``wipe`` (annotated destructive), ``ask`` (``ctx.elicit()``).
``POST /_add_tool`` registers one more tool (``extra``) and tells open sessions the list changed.
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

mcp = MCPServer("handshake-test-server", version="3.1.4")


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Return the text."""
    return f"echo: {text}"


@mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
def wipe(target: str) -> str:
    """Wipe something (pretend)."""
    return f"wiped {target}"


class Name(BaseModel):
    name: str


@mcp.tool()
async def ask(ctx: Context) -> str:
    """Ask for a name over the session."""
    answer = await ctx.elicit("What is your name?", Name)
    return f"hello {getattr(answer, 'data', None)}"


def extra() -> str:
    """Added at run time."""
    return "extra"


@mcp.custom_route("/_add_tool", methods=["POST"])
async def add_tool(request: Request) -> Response:
    if mcp._tool_manager.get_tool("extra") is None:  # test-only reach into the SDK
        mcp.add_tool(extra)
    return JSONResponse({"ok": True})


class HandshakeOnly:
    """Drop an MCP-Protocol-Version header this server's era does not know, as an mcp 1.x server never
    routes one anywhere but its session-bound transport."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [
                (k, v)
                for k, v in scope["headers"]
                if k != b"mcp-protocol-version" or v.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS
            ]
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


def main() -> None:
    if sys.argv[1] == "--stdio":
        mcp.run("stdio")
        return
    port = int(sys.argv[1])
    app = HandshakeOnly(mcp.streamable_http_app(json_response=True, stateless_http=False))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
