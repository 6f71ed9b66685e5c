"""A FastMCP 2.x server on `mcp` 1.x (the line most deployed Python servers run), in its own venv.

Handshake era only: it needs `initialize` and an `Mcp-Session-Id`; `ctx.elicit()` sends
`elicitation/create` on the open stream.

    var/interop/fastmcp2/bin/python tests/interop/servers/fastmcp2_elicit.py --port PORT
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from common import RUNS, arguments, outcome_text, ran
from fastmcp import Context, FastMCP
from starlette.requests import Request
from starlette.responses import JSONResponse


@dataclass
class Booking:
    name: str
    seats: int


mcp = FastMCP("interop-fastmcp2")


@mcp.tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    ran("add")
    return a + b


@mcp.tool
async def book_table(restaurant: str, ctx: Context) -> str:
    """Book a table, asking who it is for."""
    ran("book_table")
    result = await ctx.elicit(f"Who is the table at {restaurant} for?", response_type=Booking)
    content = vars(result.data) if result.action == "accept" else None
    return outcome_text(result.action, content)


@mcp.tool
async def slow_report(seconds: float, ctx: Context) -> str:
    """Take `seconds` to finish, reporting progress every second."""
    ran("slow_report")
    steps = max(1, int(seconds))
    for step in range(1, steps + 1):
        await anyio.sleep(seconds / steps)
        await ctx.report_progress(step, steps)
    return f"report ready after {seconds:g} s"


@mcp.custom_route("/runs", methods=["GET"])
async def runs(request: Request) -> JSONResponse:
    return JSONResponse(dict(RUNS))


if __name__ == "__main__":
    args = arguments(__doc__ or "")
    mcp.run(
        transport="http", host=args.host, port=args.port, path="/mcp", log_level="warning", show_banner=False
    )
