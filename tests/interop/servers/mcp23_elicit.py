"""An `mcp` 2.3 `MCPServer` whose tools use `ctx.elicit()`: the first thing the SDK docs teach.

`ctx.elicit()` sends `elicitation/create` on the open stream of a handshake-era connection; on a
2026-07-28 connection it fails ("no back-channel"). Served over Streamable HTTP with sessions.

    python tests/interop/servers/mcp23_elicit.py --port PORT     (http://127.0.0.1:PORT/mcp)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import uvicorn
from common import RUNS, arguments, outcome_text, ran
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse


class Booking(BaseModel):
    name: str
    seats: int


mcp = MCPServer("interop-mcp23", version="1.0.0", log_level="WARNING")


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    ran("add")
    return a + b


@mcp.tool()
async def book_table(restaurant: str, ctx: Context) -> str:
    """Book a table, asking who it is for."""
    ran("book_table")
    result = await ctx.elicit(f"Who is the table at {restaurant} for?", Booking)
    content = result.data.model_dump() if result.action == "accept" else None
    return outcome_text(result.action, content)


@mcp.tool()
async def slow_report(seconds: float, ctx: Context) -> str:
    """Take `seconds` to finish, reporting progress every second."""
    ran("slow_report")
    steps = max(1, int(seconds))
    for step in range(1, steps + 1):
        await anyio.sleep(seconds / steps)
        await ctx.report_progress(step, steps, f"step {step} of {steps}")
    return f"report ready after {seconds:g} s"


@mcp.custom_route("/runs", methods=["GET"])
async def runs(request: Request) -> JSONResponse:
    return JSONResponse(dict(RUNS))


if __name__ == "__main__":
    args = arguments(__doc__ or "")
    app = mcp.streamable_http_app(host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
