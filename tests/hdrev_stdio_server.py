"""A stdio MCP server that misbehaves on its own stdout and stderr (the hub starts it as a command).

    python tests/hdrev_stdio_server.py

Built on the official SDK (`MCPServer.run("stdio")`). Tools:
- ``echo(text)``: answers `text`.
- ``garbage(name)``: writes to its stdout, before its answer, a line that is not JSON-RPC and begins with the
  value of its environment variable `name` (a server printing its configuration by mistake); answers "ok".
- ``huge(size)``: writes a line of `size` bytes (not JSON-RPC) to its stdout; answers "ok".
- ``confess(name)``: writes the value of its environment variable `name` to its stderr, as it is (over several
  lines when it holds newlines); answers "ok".
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("hdrev-stdio-server", version="1.0.0")
# The SDK's stdio server points fd 1 at stderr while it serves (so a print cannot break the protocol): what
# this server writes "to its stdout" goes to the pipe the hub reads, through a copy taken first.
WIRE = os.dup(1)


def _stdout(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(WIRE, view) :]


@mcp.tool()
def echo(text: str) -> str:
    return text


@mcp.tool()
def garbage(name: str) -> str:
    _stdout(f"{os.environ.get(name, '')} is the key this server uses\n".encode())
    return "ok"


@mcp.tool()
def huge(size: int) -> str:
    _stdout(b"x" * size + b"\n")
    return "ok"


@mcp.tool()
def confess(name: str) -> str:
    print(f"my secret: {os.environ.get(name, '')}", file=sys.stderr, flush=True)
    return "ok"


if __name__ == "__main__":
    mcp.run("stdio")
