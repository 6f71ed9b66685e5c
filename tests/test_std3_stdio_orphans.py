"""stdio servers that fork: a child left running once the server exited (a crash) held its stdout open, so the
hub never saw the exit (a call waited until its limit), and the child ran on, orphaned, through restarts,
stops and the holder's own restart. Real parts: a real stdio MCP server process (on the `mcp` SDK, written
below into the test's stdio directory), the supervisor, ``manage.py run_holder``, PostgreSQL."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from approvals.holder import stdio as stdio_holder
from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import Completed, McpError
from approvals.mcp_client.session import SessionHooks, call_on
from approvals.models import Holder, McpServer, ToolCall
from approvals.services import holding
from elicit_hub import engines
from tests import factories
from tests.live import HolderRunner, child_env, wait_until

SLUG = "forking-tools"
SERVER_SOURCE = '''
"""A stdio MCP server whose tools fork (each child writes its pid to a file in the working directory)."""
import asyncio
import os
import signal
import threading
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("std3-forking-server", version="1.0.0")
if os.environ.get("LINGER"):
    # Outlives its closed stdin (a thread that never ends) and ignores SIGTERM: only SIGKILL ends it. It notes
    # when SIGTERM came (the system's monotonic clock, which every process shares) in the file LINGER names.
    def _noted(signum, frame):
        with open(os.environ["LINGER"], "a") as f:
            f.write(f"{time.monotonic()}\\n")

    signal.signal(signal.SIGTERM, _noted)
    threading.Thread(target=time.sleep, args=(3600,)).start()


def _child(name, leave_group=False):
    """Fork a child that sleeps with the server's stdout and stderr still open; the parent gets its pid."""
    pid = os.fork()
    if pid:
        return pid
    if leave_group:
        os.setsid()
    with open(name, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    os._exit(0)


@mcp.tool()
def echo(text: str = "hi") -> str:
    return text


@mcp.tool()
def fork_and_exit() -> str:
    _child("child.pid")
    time.sleep(0.3)
    os._exit(3)


@mcp.tool()
def fork_child() -> int:
    return _child("child.pid")


@mcp.tool()
def daemon_and_exit() -> str:
    _child("daemon.pid", leave_group=True)
    time.sleep(0.3)
    os._exit(3)


@mcp.tool()
async def slow(seconds: float = 60) -> str:
    """Runs for `seconds` without blocking the server, which exits at once when its stdin closes."""
    with open("runs", "a") as f:
        f.write("x")
    _child("child.pid")
    await anyio.sleep(seconds)
    return "slept"


@mcp.tool()
def stuck(seconds: float = 120) -> str:
    """Blocks the whole server (its closed stdin goes unnoticed)."""
    with open("stuck", "w") as f:
        f.write("x")
    time.sleep(seconds)
    return "unstuck"


_LATER = set()


@mcp.tool()
async def nag(ctx: Context, times: int = 200) -> str:
    """Answers at once; a moment later, between calls, asks `times` questions at once (no call to ask for)."""
    session = ctx.session
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}

    async def later() -> None:
        await anyio.sleep(0.3)
        async with anyio.create_task_group() as tg:
            for _ in range(times):
                tg.start_soon(session.elicit_form, "Anyone there?", schema)
        with open("nagged", "w") as f:
            f.write(str(times))

    task = asyncio.get_running_loop().create_task(later())
    _LATER.add(task)
    return "nagging"


if __name__ == "__main__":
    mcp.run("stdio")
'''

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def stdio_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex
    root.mkdir(parents=True)
    script = root / "forking_server.py"
    script.write_text(SERVER_SOURCE)
    os.chmod(script, 0o644)
    monkeypatch.setattr(settings, "ELICIT_STDIO_DIR", root, raising=False)
    try:
        yield root
    finally:
        for name in ("child.pid", "daemon.pid"):
            pid = _pid(root, name)
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def _server(root: Path, slug: str = SLUG, env: dict[str, str] | None = None) -> McpServer:
    return McpServer.objects.create(
        slug=slug,
        name=slug,
        env=env or {},
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(root / "forking_server.py")],
        era=McpServer.Era.HANDSHAKE,
        call_timeout=60,
    )


def _pid(root: Path, name: str) -> int | None:
    path = root / SLUG / name
    return int(path.read_text()) if path.is_file() and path.read_text() else None


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def _zombie_children() -> list[int]:
    """This process's children that exited and were never reaped."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry))
    return found


async def _eventually(predicate: Any, timeout: float, what: str) -> None:
    """`wait_until` without blocking the event loop (the supervisor runs on it)."""
    with anyio.move_on_after(timeout):
        while not predicate():
            await anyio.sleep(0.1)
    assert predicate(), f"timed out after {timeout:.0f} s waiting for {what}"


async def _no_elicit(params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("no elicitation expected")


async def _call(supervisor: StdioSupervisor, tool: str, timeout: float = 45) -> Any:
    async with supervisor.session(wait=30) as (client, dispatcher):
        return await call_on(client, dispatcher, SessionHooks(elicit=_no_elicit), tool, {}, timeout=timeout)


@pytest.fixture
async def supervisor(live_db: None, stdio_root: Path) -> AsyncIterator[StdioSupervisor]:
    server = await sync_to_async(_server)(stdio_root)
    holder = await sync_to_async(Holder.objects.create)(name="host:1:std3", heartbeat_at=timezone.now())
    running = StdioSupervisor(server.pk, holder.name)
    assert await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def test_a_server_that_exits_leaving_a_forked_child_ends_its_call_at_once_and_the_child_with_it(
    supervisor: StdioSupervisor, stdio_root: Path
) -> None:
    assert isinstance(await _call(supervisor, "echo"), Completed)
    began = time.monotonic()
    with pytest.raises(McpError) as raised:
        await _call(supervisor, "fork_and_exit", timeout=45)
    # The exit ends the call (the tool may have run), not the call's limit: the child held the pipe open.
    assert time.monotonic() - began < 15
    assert raised.value.may_have_run
    child = _pid(stdio_root, "child.pid")
    assert child is not None
    await _eventually(lambda: not _alive(child), 10, "the orphaned child to be killed")
    # The server is restarted and serves the next call; no process it ran is left unreaped here.
    assert isinstance(await _call(supervisor, "echo"), Completed)
    assert supervisor.restarts == 1
    assert _zombie_children() == []


async def test_a_child_the_server_leaves_running_is_killed_when_the_server_is_stopped(
    supervisor: StdioSupervisor, stdio_root: Path
) -> None:
    outcome = await _call(supervisor, "fork_child")
    assert isinstance(outcome, Completed)
    child = _pid(stdio_root, "child.pid")
    assert child is not None and _alive(child)
    # The server exits on its own once its stdin closes (within the SDK's grace, so the SDK kills no tree).
    await supervisor.stop()
    await _eventually(lambda: not _alive(child), 10, "the server's child to be killed")
    assert _zombie_children() == []


async def test_a_child_that_left_the_process_group_cannot_keep_the_ended_session_open(
    supervisor: StdioSupervisor, stdio_root: Path
) -> None:
    began = time.monotonic()
    with pytest.raises(McpError) as raised:
        await _call(supervisor, "daemon_and_exit", timeout=45)
    assert time.monotonic() - began < stdio_holder.ORPHAN_GRACE + 10
    assert raised.value.may_have_run
    assert isinstance(await _call(supervisor, "echo"), Completed)


@pytest.fixture
def holder_env(stdio_root: Path) -> dict[str, str]:
    return child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_STDIO_DIR=str(stdio_root))


def _ended(call_id: Any, timeout: float = 60) -> ToolCall:
    def done() -> ToolCall | None:
        call = ToolCall.objects.get(pk=call_id)
        return call if call.status in ToolCall.Status.finals() else None

    return wait_until(done, timeout, 0.2, what=f"call {call_id} to end")  # type: ignore[return-value]


def test_a_holder_restarted_with_a_call_in_flight_leaves_nothing_of_its_server_running(
    live_db: None, stdio_root: Path, holder_env: dict[str, str]
) -> None:
    server = _server(stdio_root)
    first = HolderRunner(holder_env, name="std3-first").start()
    try:
        call = factories.call(server, tool="slow", arguments={"seconds": 60})
        holding.notify()
        wait_until(lambda: _pid(stdio_root, "child.pid") is not None, 30, 0.1, what="the tool to run")
        child = _pid(stdio_root, "child.pid")
        assert child is not None
        assert first.proc is not None
        first.proc.send_signal(signal.SIGTERM)
        first.proc.wait(timeout=30)
    finally:
        first.stop()
    # The call that was running is reported as one that may have run, never sent again; nothing of the
    # server it ran is left running (the child would otherwise run on, in the next server's directory).
    ended = ToolCall.objects.get(pk=call.pk)
    assert ended.status == ToolCall.Status.FAILED and ended.error is not None
    assert ended.error["code"] == "holder_lost" and ended.error["tool_may_have_run"] is True
    wait_until(lambda: not _alive(child), 10, 0.1, what="the server's child to be killed")
    assert McpServer.objects.get(pk=server.pk).stdio_holder is None

    second = HolderRunner(holder_env, name="std3-second").start()
    try:
        again = factories.call(server, tool="echo", arguments={"text": "again"})
        holding.notify()
        done = _ended(again.pk)
        assert done.status == ToolCall.Status.COMPLETED, done.error
    finally:
        second.stop()
    assert (stdio_root / SLUG / "runs").read_text() == "x"
    assert ToolCall.objects.get(pk=call.pk).status == ToolCall.Status.FAILED


async def test_questions_a_server_asks_between_calls_are_declined_with_a_bounded_log(
    supervisor: StdioSupervisor, stdio_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert isinstance(await _call(supervisor, "nag"), Completed)
    # Every question is answered (declined: no call to ask for), and the session goes on serving calls.
    await _eventually(lambda: (stdio_root / SLUG / "nagged").is_file(), 30, "the questions to be answered")
    assert isinstance(await _call(supervisor, "echo"), Completed)
    lines = [r for r in caplog.records if "between calls" in r.getMessage()]
    assert 1 <= len(lines) <= 10, len(lines)
    assert "(128 so far)" in lines[-1].getMessage()


def test_a_holder_stops_its_stdio_servers_that_ignore_sigterm_all_at_once(
    live_db: None, stdio_root: Path, holder_env: dict[str, str]
) -> None:
    # Each server notes its SIGTERM in its own working directory (the only one it may write to).
    notes = [stdio_root / f"linger-{n}" / "sigterm-noted" for n in range(3)]
    servers = [_server(stdio_root, f"linger-{n}", {"LINGER": "sigterm-noted"}) for n in range(3)]
    runner = HolderRunner(holder_env, name="std3-linger").start()
    try:
        calls = [factories.call(server, tool="echo", arguments={}) for server in servers]
        holding.notify()
        for call in calls:
            assert _ended(call.pk).status == ToolCall.Status.COMPLETED
        assert runner.proc is not None
        runner.proc.send_signal(signal.SIGTERM)
        runner.proc.wait(timeout=60)
    finally:
        runner.stop()
    # Each idle server outlives its closed stdin and its SIGTERM, so it is killed only after the SDK's grace
    # and SIGTERM's (about 4.5 s). Stopped one after the other, each got its SIGTERM that long after the one
    # before (9 s from the first to the third), and the holder's stop grew with every such server; stopped
    # together, they get it together.
    came = [float(note.read_text().split()[0]) for note in notes]
    assert max(came) - min(came) < 3, came
    assert not McpServer.objects.filter(pk__in=[s.pk for s in servers], stdio_holder__isnull=False).exists()
