"""A small stdio MCP server for the stdio supervisor tests (the hub starts it as a command).

    python tests/stdio_test_server.py

Built on the official SDK (`MCPServer.run("stdio")`). Tools: ``echo``; ``where`` (its working directory,
user id and environment names, and the values of the names it is asked for); ``shout`` (writes a line to
stderr, answers "ok"); ``crash`` (writes to stderr and exits at once, mid-call); ``block`` (blocks the whole
process); ``ask`` (``ctx.elicit()``: a question pushed to the client on the open session); ``started``
(when this process started); ``grow`` (adds a tool a moment later and sends
notifications/tools/list_changed between calls).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

STARTED = time.time()
print(f"stdio test server starting, pid {os.getpid()}", file=sys.stderr, flush=True)

mcp = MCPServer("elicit-hub-stdio-test-server", version="1.0.0")


@mcp.tool()
def echo(text: str) -> str:
    return text


@mcp.tool()
def where(names: list[str] | None = None) -> dict:
    return {
        "cwd": os.getcwd(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "pid": os.getpid(),
        "env_keys": sorted(os.environ),
        "values": {name: os.environ.get(name) for name in names or []},
    }


@mcp.tool()
def shout(text: str) -> str:
    print(text, file=sys.stderr, flush=True)
    return "ok"


@mcp.tool()
def crash(text: str = "crashing now") -> str:
    print(text, file=sys.stderr, flush=True)
    os._exit(3)


@mcp.tool()
def block(seconds: float = 600) -> str:
    """Blocks the whole server (it reads nothing meanwhile, so a closed stdin goes unnoticed)."""
    time.sleep(seconds)
    return "unblocked"


_LATER: set[asyncio.Task[None]] = set()


@mcp.tool()
async def grow(ctx: Context, name: str = "extra") -> str:
    """Answers at once; a moment later adds the tool `name` and says so (tools/list_changed)."""
    session = ctx.session

    async def later() -> None:
        await asyncio.sleep(0.3)
        mcp.add_tool(lambda: "new", name=name, description="added while the server runs")
        await session.send_tool_list_changed()

    task = asyncio.get_running_loop().create_task(later())
    _LATER.add(task)
    task.add_done_callback(_LATER.discard)
    return "growing"


@mcp.tool()
def started() -> float:
    return STARTED


class Name(BaseModel):
    name: str


@mcp.tool()
async def ask(ctx: Context) -> str:
    answer = await ctx.elicit("What is your name?", Name)
    if answer.action == "accept":
        return f"hello {answer.data.name}"
    return answer.action


if __name__ == "__main__":
    mcp.run("stdio")
