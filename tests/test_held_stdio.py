"""What a stdio server may do with its own stderr: close it, flood it, or print its credentials on it.

Real parts only: the stdio test server (tests/stdio_test_server.py, on the `mcp` SDK) started by the
supervisor a holder runs, its lease in the embedded PostgreSQL.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from approvals.holder import stdio as stdio_holder
from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import McpError
from approvals.models import McpServer
from tests.test_stdio import SERVER_SCRIPT, _stdio_dir, anyio_backend, call, make_holder, make_server, value

__all__ = ["_stdio_dir", "anyio_backend"]  # the fixtures of tests/test_stdio.py, used here too

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("live_db")]

# Runs the stdio test server after pointing its stderr at /dev/null (a server that logs to a file of its own).
QUIET = (
    "import os, runpy, sys; os.dup2(os.open(os.devnull, os.O_WRONLY), 2); "
    "runpy.run_path(sys.argv[1], run_name='__main__')"
)


async def _supervisor(slug: str, args: list[str], **fields: Any) -> StdioSupervisor:
    server = await sync_to_async(make_server)(slug=slug, **fields)
    await sync_to_async(McpServer.objects.filter(pk=server.pk).update)(args=args)
    holder = await sync_to_async(make_holder)("host:1:a")
    return StdioSupervisor(server.pk, holder.name)


async def test_a_server_that_closes_its_stderr_is_not_taken_for_dead() -> None:
    supervisor = await _supervisor("quiet", ["-c", QUIET, str(SERVER_SCRIPT)])
    try:
        first = value(await call(supervisor, "started"))
        assert value(await call(supervisor, "echo", {"text": "still here"})) == "still here"
        assert value(await call(supervisor, "started")) == first
        assert supervisor.restarts == 0
        # Its real exit is still seen: the next call runs on a new process.
        with pytest.raises(McpError):
            await call(supervisor, "crash")
        assert value(await call(supervisor, "started")) != first
        assert supervisor.restarts == 1
    finally:
        await supervisor.stop()


async def test_the_servers_credentials_never_reach_the_log_from_its_stderr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "sk-live-0123456789abcdef"
    supervisor = await _supervisor("chatty", [str(SERVER_SCRIPT)], env={"API_TOKEN": secret, "SHORT": "abc"})
    caplog.set_level(logging.INFO, logger="approvals.stdio.chatty")
    try:
        said = f"connecting with token {secret} (abc)"
        assert value(await call(supervisor, "shout", {"text": said})) == "ok"
        assert value(await call(supervisor, "echo", {"text": "after"})) == "after"
    finally:
        await supervisor.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "approvals.stdio.chatty"]
    assert any(line.startswith("connecting with token ") for line in lines), lines
    assert not any(secret in line for line in lines)
    assert not any(secret[:12] in line for line in lines)


# Writes `sys.argv[2]` lines to stderr, then runs the stdio test server.
NOISY = (
    "import runpy, sys; n = int(sys.argv[2]); "
    "sys.stderr.writelines(f'noise {i}\\n' for i in range(n)); sys.stderr.flush(); "
    "runpy.run_path(sys.argv[1], run_name='__main__')"
)


async def test_a_flood_on_stderr_is_bounded_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    sent = 20 * stdio_holder.STDERR_BURST
    supervisor = await _supervisor("noisy", ["-c", NOISY, str(SERVER_SCRIPT), str(sent)])
    caplog.set_level(logging.INFO, logger="approvals.stdio.noisy")
    began = time.monotonic()
    try:
        assert value(await call(supervisor, "echo", {"text": "heard"})) == "heard"
    finally:
        await supervisor.stop()
    elapsed = time.monotonic() - began
    lines = [r.getMessage() for r in caplog.records if r.name == "approvals.stdio.noisy"]
    noise = [line for line in lines if line.startswith("noise ")]
    assert noise[:3] == ["noise 0", "noise 1", "noise 2"]
    assert len(noise) <= stdio_holder.STDERR_BURST + stdio_holder.STDERR_RATE * elapsed + 1
    dropped = [line for line in lines if "stderr lines not logged" in line]
    assert dropped
    counted = sum(int(line.split()[0].lstrip("[")) for line in dropped)
    assert counted + len(noise) >= sent
