"""Run the demo MCP server (`python -m approvals.demo`) as a real subprocess for tests, and drive its hooks.

    with DemoServer() as demo:           # free loopback port, test hooks on
        demo.url                         # http://127.0.0.1:PORT/mcp
        reset(demo.url); hold(demo.url, "create_deployment", "after", 5)
        demo.restart()                   # same port; state sealed before the restart stays valid

The hook helpers take either the `/mcp` URL or the server's base URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import httpx

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DemoServer:
    """One demo server process on 127.0.0.1; `restart()` keeps the port so clients keep their URL."""

    def __init__(
        self, port: int | None = None, env: Mapping[str, str] | None = None, *, test_hooks: bool = True
    ) -> None:
        self.port = port or free_port()
        self.env = dict(env or {})
        self.test_hooks = test_hooks
        self.process: subprocess.Popen[bytes] | None = None
        # One log across restarts, read back when start-up fails; closed by __exit__.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/mcp"

    def start(self) -> DemoServer:
        env = {**os.environ, "ELICIT_DEMO_TEST_HOOKS": "1" if self.test_hooks else "0", **self.env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "approvals.demo", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_until_ready()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, and SIGKILL only if the server does not shut down in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, env: Mapping[str, str] | None = None) -> DemoServer:
        """Stop and start again on the same port; `env` replaces the extra environment when given."""
        self.stop()
        if env is not None:
            self.env = dict(env)
        return self.start()

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self._log.close()

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"demo server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"demo server did not answer within {STARTUP_TIMEOUT}s:\n{self.log()}")


def start_demo_server(port: int | None = None, env: Mapping[str, str] | None = None) -> DemoServer:
    """Start a demo server with test hooks and wait until it answers; call `.stop()` when done."""
    return DemoServer(port, env).start()


def _hooks(url: str) -> str:
    base = url.rstrip("/").removesuffix("/mcp")
    return f"{base}/test-hooks"


def executions(url: str) -> dict[str, int]:
    """Completed, successful runs per tool (a replayed Idempotency-Key answer is not a run)."""
    return httpx.get(f"{_hooks(url)}/executions").raise_for_status().json()


def recorded_requests(url: str) -> list[dict[str, Any]]:
    """Every POST to /mcp since the last reset, oldest first.

    Each is {"headers": {lower-case name: value}, "body": the parsed JSON-RPC request}.
    """
    return httpx.get(f"{_hooks(url)}/requests").raise_for_status().json()


def reset(url: str) -> None:
    """Forget executions, recorded requests, holds (releasing held requests) and stored idempotent answers."""
    httpx.post(f"{_hooks(url)}/reset").raise_for_status()


def describe(url: str, tool: str, description: str) -> None:
    """Make the server describe `tool` differently from now on (its tools/list changes; reset restores it)."""
    httpx.post(f"{_hooks(url)}/describe", json={"tool": tool, "description": description}).raise_for_status()


def hold(url: str, tool: str, phase: Literal["before", "after"], seconds: float) -> None:
    """Hold the next retry (a tools/call carrying inputResponses) of `tool` for `seconds`."""
    httpx.post(
        f"{_hooks(url)}/hold", json={"tool": tool, "phase": phase, "seconds": seconds}
    ).raise_for_status()


def inflight(url: str) -> dict[str, Any]:
    """{"held": requests held right now, "phase": their phase or None, "armed": [holds not yet used]}."""
    return httpx.get(f"{_hooks(url)}/inflight").raise_for_status().json()


def wait_for_held(url: str, count: int = 1, timeout: float = 10.0) -> dict[str, Any]:
    """Block until `count` requests are being held (e.g. before SIGKILLing the client that sent them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = inflight(url)
        if state["held"] >= count:
            return state
        time.sleep(0.02)
    raise TimeoutError(f"fewer than {count} held requests after {timeout}s: {inflight(url)}")
