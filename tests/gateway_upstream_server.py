"""An upstream MCP server for the gateway's tests (run as a subprocess), on the official SDK (`MCPServer`):

    python tests/gateway_upstream_server.py PORT

One tool, ``report``, with an output schema (from its return type): it answers ``structuredContent`` of
about ``size`` bytes (and, as the SDK does, the same JSON as text). Its results carry the SDK's
``io.modelcontextprotocol/serverInfo`` stamp naming this server (`NAME`) on 2026-07-28 requests.
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

NAME = "gateway-upstream-test"

mcp = MCPServer(NAME, version="9.9.9")


class Report(BaseModel):
    size: int
    body: str


@mcp.tool()
def report(size: int) -> Report:
    """A typed report of about `size` bytes."""
    return Report(size=size, body="r" * size)


def main() -> None:
    app = mcp.streamable_http_app(json_response=True, stateless_http=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")


if __name__ == "__main__":
    main()
