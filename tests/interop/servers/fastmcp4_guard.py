"""A FastMCP 4 server: a multi-round guard tool (SEP-2322, revision 2026-07-28) and a `ctx.elicit()` tool.

`approve_transfer` asks twice by returning `InputRequiredResult` from its body (first which account,
then a confirmation naming it, the account carried in `requestState`); it works on 2026-07-28
connections. `book_table` uses `ctx.elicit()`, which only works on a handshake-era connection.

    python tests/interop/servers/fastmcp4_guard.py --port PORT     (http://127.0.0.1:PORT/mcp)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from common import RUNS, arguments, outcome_text, ran
from fastmcp import Context, FastMCP
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    TextContent,
)
from starlette.requests import Request
from starlette.responses import JSONResponse

mcp = FastMCP("interop-fastmcp4")


@dataclass
class Booking:
    name: str
    seats: int


def _form(message: str, properties: dict, required: list[str]) -> ElicitRequest:
    schema = {"type": "object", "properties": properties, "required": required}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _text(text: str, *, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)


def _answer(ctx: Context, key: str) -> tuple[str, dict | None] | None:
    raw = (ctx.input_responses or {}).get(key)
    if raw is None:
        return None
    data = raw.model_dump(mode="json") if hasattr(raw, "model_dump") else dict(raw)
    return data.get("action", "cancel"), data.get("content")


@mcp.tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    ran("add")
    return a + b


@mcp.tool
async def approve_transfer(amount: int, ctx: Context) -> CallToolResult | InputRequiredResult:
    """Move money after two questions: which account, then a confirmation naming it."""
    state = json.loads(ctx.request_state) if ctx.request_state else {}
    if "account" not in state:
        answer = _answer(ctx, "account")
        if answer is None:
            return InputRequiredResult(
                input_requests={
                    "account": _form(
                        f"Which account pays {amount}?", {"account": {"type": "string"}}, ["account"]
                    )
                },
                request_state=json.dumps({"round": 1}),
            )
        action, content = answer
        if action != "accept" or not content:
            return _text(f"transfer stopped at the account question: {action}", error=True)
        account = str(content["account"])
        return InputRequiredResult(
            input_requests={
                "confirm": _form(
                    f"Pay {amount} from {account}?", {"confirm": {"type": "boolean"}}, ["confirm"]
                )
            },
            request_state=json.dumps({"round": 2, "account": account}),
        )
    answer = _answer(ctx, "confirm")
    if answer is None:
        return _text("no confirmation in the retry", error=True)
    action, content = answer
    if action != "accept" or not (content or {}).get("confirm"):
        return _text(f"transfer stopped at the confirmation: {action}", error=True)
    ran("approve_transfer")
    return _text(f"paid {amount} from {state['account']}")


@mcp.tool
async def book_table(restaurant: str, ctx: Context) -> str:
    """Book a table, asking who it is for (handshake-era connections only)."""
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
