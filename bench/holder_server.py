"""The MCP server of the holder benchmark: a handshake-era tool that asks with ``ctx.elicit()`` and waits.

``wait_for_person(n)`` records when it sends ``elicitation/create`` (wall clock, this machine), then waits
for the answer as long as it takes. ``GET /sent`` returns ``{n: unix time}``; ``GET /answered`` the count of
answers received.

    python bench/holder_server.py --port PORT      (http://127.0.0.1:PORT/mcp, sessions, Streamable HTTP)
"""

from __future__ import annotations

import argparse
import time

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

SENT: dict[str, float] = {}
ANSWERED: list[str] = []


class Approval(BaseModel):
    ok: bool


mcp = MCPServer("bench-holder", version="1.0.0", log_level="WARNING")


@mcp.tool()
async def wait_for_person(n: int, ctx: Context) -> str:
    """Ask a person and wait for the answer."""
    SENT[str(n)] = time.time()
    result = await ctx.elicit(f"Benchmark question {n}", Approval)
    ANSWERED.append(str(n))
    return result.action


@mcp.custom_route("/sent", methods=["GET"])
async def sent(request: Request) -> JSONResponse:
    return JSONResponse(SENT)


@mcp.custom_route("/answered", methods=["GET"])
async def answered(request: Request) -> JSONResponse:
    return JSONResponse({"count": len(ANSWERED)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = mcp.streamable_http_app(host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", backlog=4096)


if __name__ == "__main__":
    main()
