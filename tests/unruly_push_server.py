"""A handshake-era MCP server that asks too much, too often, or in text the hub cannot store (a subprocess).

    python tests/unruly_push_server.py PORT

The official SDK (`MCPServer`, ``mcp`` 2.3) over Streamable HTTP with sessions, as tests/push_server.py, by
uvicorn on 127.0.0.1:PORT. Its tools ask through ``ctx.elicit()`` / -32042 in the middle of ``tools/call``:

- ``nul_auth()``: refuses with ``URLElicitationRequiredError`` (-32042) whose URL elicitation's message (and
  the error's own message) hold a NUL.
- ``nul_ask()``: a form elicitation whose message holds a NUL; returns the action it got.
- ``many_urls(n)``: refuses with -32042 naming `n` URLs.
- ``loop_ask(times)``: asks `times` times in a row (each question too long to show, so the hub declines it
  without a person); returns the actions it got.
- ``flood(n)``: sends `n` progress notifications at 100 % (progress = total = 1), then returns.
- ``GET /_counts``: ``loop_ask.asked`` (questions sent), ``loop_ask.stopped`` (runs stopped before their
  end: the client sent notifications/cancelled, or the session ended), ``flood.sent``.
"""

from __future__ import annotations

import sys
from collections import Counter

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp_types import ElicitRequestURLParams
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

COUNTS: Counter[str] = Counter()
TOO_LONG = "x" * 10_001  # over ELICIT_MAX_MESSAGE: declined by the hub without a person

mcp = MCPServer("unruly-push-server", version="1.0.0")


class Answer(BaseModel):
    text: str = Field(description="Your answer")


@mcp.tool()
async def nul_auth() -> str:
    """Refuse with -32042; the URL's message holds a NUL."""
    COUNTS["nul_auth"] += 1
    raise UrlElicitationRequiredError(
        [
            ElicitRequestURLParams(
                message="Authorize\x00 access", url="https://example.com/authorize", elicitation_id="nul-1"
            )
        ],
        message="Authorization\x00 required",
    )


@mcp.tool()
async def nul_ask(ctx: Context) -> str:
    """A question whose message holds a NUL."""
    result = await ctx.elicit("Which\x00 branch?", Answer)
    return result.action


@mcp.tool()
async def many_urls(n: int) -> str:
    """Refuse with -32042 naming `n` URLs."""
    raise UrlElicitationRequiredError(
        [
            ElicitRequestURLParams(
                message=f"Open page {i}", url=f"https://example.com/page/{i}", elicitation_id=f"page-{i}"
            )
            for i in range(n)
        ]
    )


@mcp.tool()
async def loop_ask(times: int, ctx: Context) -> str:
    """Ask `times` times in a row."""
    actions: Counter[str] = Counter()
    try:
        for _ in range(times):
            COUNTS["loop_ask.asked"] += 1
            result = await ctx.elicit(TOO_LONG, Answer)
            actions[result.action] += 1
    except BaseException:
        # Stopped before its end: cancelled (the client sent notifications/cancelled), or the session it asks
        # on ended under it (a client that abandons the call may close its session instead), which the
        # waiting elicitation meets as an error, not as a cancellation.
        COUNTS["loop_ask.stopped"] += 1
        raise
    return ", ".join(f"{action}: {n}" for action, n in sorted(actions.items()))


@mcp.tool()
async def flood(n: int, ctx: Context) -> str:
    """`n` progress notifications at 100 %."""
    for i in range(n):
        await ctx.report_progress(1, 1, f"tick {i}")
        COUNTS["flood.sent"] += 1
    return f"flooded {n}"


async def counts(request: Request) -> JSONResponse:
    return JSONResponse(dict(COUNTS))


def main() -> None:
    port = int(sys.argv[1])
    inner = mcp.streamable_http_app(json_response=False, stateless_http=False)
    app = Starlette(
        routes=[Route("/_counts", counts), Mount("/", app=inner)],
        lifespan=lambda app: inner.router.lifespan_context(inner),
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
