"""stdio servers on real parts: a real stdio MCP server process (tests/stdio_test_server.py, on the `mcp`
SDK), the supervisor that runs it, and its lease in the embedded PostgreSQL."""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import signal
import stat
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from approvals.holder import stdio as stdio_holder
from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import Completed, McpError
from approvals.mcp_client.session import SessionHooks, call_on
from approvals.models import AuditEvent, Holder, McpServer
from elicit_hub import engines

SERVER_SCRIPT = Path(__file__).resolve().parent / "stdio_test_server.py"
HUB_SECRETS = ("DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "ELICIT_TEST_HUB_SECRET")
# What a stdio server's environment may hold besides its own configured variables.
BASE_ENV = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG"}

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("live_db")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _stdio_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # A fresh directory per test under ./var, as in production (reachable by the unprivileged user).
    root = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex
    monkeypatch.setattr(settings, "ELICIT_STDIO_DIR", root, raising=False)
    monkeypatch.setenv("ELICIT_TEST_HUB_SECRET", "hub-secret-value")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def make_server(slug: str = "local-tools", **fields: Any) -> McpServer:
    return McpServer.objects.create(
        slug=slug,
        name=slug,
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(SERVER_SCRIPT)],
        env=fields.pop("env", {"API_TOKEN": "tok-123456"}),
        era=McpServer.Era.HANDSHAKE,
        **fields,
    )


def make_holder(name: str, *, age: float = 0) -> Holder:
    return Holder.objects.create(name=name, heartbeat_at=timezone.now() - timedelta(seconds=age))


async def no_elicit(params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("no elicitation expected")


async def call(supervisor: StdioSupervisor, name: str, arguments: dict[str, Any] | None = None) -> Any:
    async with supervisor.session(wait=30) as (client, dispatcher):
        return await call_on(
            client, dispatcher, SessionHooks(elicit=no_elicit), name, arguments or {}, timeout=30
        )


def value(outcome: Any) -> Any:
    assert isinstance(outcome, Completed), outcome
    result = outcome.result
    if result.get("structuredContent") is not None:
        structured = result["structuredContent"]
        return structured.get("result", structured)
    text = result["content"][0]["text"]
    return json.loads(text) if text.startswith("{") else text


@pytest.fixture
async def running() -> AsyncIterator[tuple[McpServer, StdioSupervisor]]:
    server = await sync_to_async(make_server)()
    holder = await sync_to_async(make_holder)("host:1:a")
    supervisor = StdioSupervisor(server.pk, holder.name)
    assert await supervisor.start()
    try:
        yield server, supervisor
    finally:
        await supervisor.stop()


async def test_a_call_completes_and_stderr_goes_to_the_log_not_the_result(
    running: tuple[McpServer, StdioSupervisor], caplog: pytest.LogCaptureFixture
) -> None:
    server, supervisor = running
    caplog.set_level(logging.INFO, logger=f"approvals.stdio.{server.slug}")
    assert value(await call(supervisor, "echo", {"text": "hi there"})) == "hi there"
    outcome = await call(supervisor, "shout", {"text": "a line for the operator only"})
    assert value(outcome) == "ok"
    assert "a line for the operator only" not in str(outcome)
    lines = [r.getMessage() for r in caplog.records if r.name == f"approvals.stdio.{server.slug}"]
    assert "a line for the operator only" in lines
    assert any(line.startswith("stdio test server starting") for line in lines)
    held = await sync_to_async(lambda: McpServer.objects.get(pk=server.pk).stdio_holder.name)()
    assert held == "host:1:a"


async def test_a_crashed_server_is_restarted_and_the_next_call_works(
    running: tuple[McpServer, StdioSupervisor], caplog: pytest.LogCaptureFixture
) -> None:
    server, supervisor = running
    caplog.set_level(logging.INFO, logger=f"approvals.stdio.{server.slug}")
    first = value(await call(supervisor, "started"))
    with pytest.raises(McpError):
        await call(supervisor, "crash", {"text": "going down now"})
    # The crash's last words reach the log; the next call waits for the new process and completes.
    assert value(await call(supervisor, "echo", {"text": "again"})) == "again"
    assert value(await call(supervisor, "started")) != first
    assert supervisor.restarts == 1
    assert "going down now" in [r.getMessage() for r in caplog.records]
    restarted = await sync_to_async(
        lambda: list(AuditEvent.objects.filter(verb="server.stdio_restarted").values_list("data", flat=True))
    )()
    assert len(restarted) == 1 and restarted[0]["server"] == server.slug
    assert restarted[0]["reason"] == "the process exited"


async def test_the_process_runs_unprivileged_in_its_own_directory_with_only_its_environment(
    running: tuple[McpServer, StdioSupervisor], _stdio_dir: Path
) -> None:
    server, supervisor = running
    seen = value(await call(supervisor, "where", {"names": ["API_TOKEN", "HOME", "PATH", *HUB_SECRETS]}))
    workdir = _stdio_dir / server.slug
    assert seen["cwd"] == str(workdir)
    assert seen["values"]["HOME"] == str(workdir)
    assert seen["values"]["API_TOKEN"] == "tok-123456"
    assert seen["values"]["PATH"].startswith(os.path.dirname(sys.executable) + ":")
    for name in HUB_SECRETS:
        assert seen["values"][name] is None
    assert set(seen["env_keys"]) <= BASE_ENV | {"API_TOKEN"}
    mode = os.stat(workdir)
    assert stat.S_IMODE(mode.st_mode) == 0o700
    if os.geteuid() == 0:
        nobody = pwd.getpwnam(settings.ELICIT_STDIO_USER)
        assert (seen["uid"], seen["gid"], seen["groups"]) == (nobody.pw_uid, nobody.pw_gid, [])
        assert (mode.st_uid, mode.st_gid) == (nobody.pw_uid, nobody.pw_gid)
    else:
        assert seen["uid"] == os.geteuid()


async def test_a_pushed_elicitation_reaches_the_call_running_on_the_session(
    running: tuple[McpServer, StdioSupervisor],
) -> None:
    _, supervisor = running
    asked: list[dict[str, Any]] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"action": "accept", "content": {"name": "Ada"}}

    async with supervisor.session(wait=30) as (client, dispatcher):
        outcome = await call_on(client, dispatcher, SessionHooks(elicit=elicit), "ask", {}, timeout=30)
    assert value(outcome) == "hello Ada"
    assert asked[0]["message"] == "What is your name?"


async def test_two_supervisors_for_one_server_only_one_runs_it() -> None:
    server = await sync_to_async(make_server)()
    first = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:1:a")).name)
    second = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:2:b")).name)
    try:
        assert await first.start()
        assert not await second.start()
        assert not second.running
        with pytest.raises(McpError) as refused:
            async with second.session(wait=1):
                pass
        assert refused.value.code == "connect_failed"
        assert value(await call(first, "echo", {"text": "one"})) == "one"
    finally:
        await second.stop()
        await first.stop()
    # Stopping releases the lease (the second's stop does not release the first's).
    holder = await sync_to_async(lambda: McpServer.objects.get(pk=server.pk).stdio_holder)()
    assert holder is None


async def test_a_stale_holders_lease_is_taken_over_and_the_old_supervisor_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stdio_holder, "LEASE_CHECK_EVERY", 0.2)
    server = await sync_to_async(make_server)()
    old = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:1:old")).name)
    new = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:2:new")).name)
    try:
        assert await old.start()
        assert value(await call(old, "echo", {"text": "old"})) == "old"
        assert not await new.start()  # the old holder's heartbeat is fresh
        stale = timezone.now() - timedelta(seconds=settings.ELICIT_HOLDER_STALE + 5)
        await sync_to_async(lambda: Holder.objects.filter(name="host:1:old").update(heartbeat_at=stale))()
        assert await new.start()
        assert value(await call(new, "echo", {"text": "new"})) == "new"
        # The old supervisor sees the lease is gone and ends its process without starting another.
        for _ in range(100):
            if not old.running:
                break
            await stdio_holder.asyncio.sleep(0.1)
        assert not old.running and old.lost
        with pytest.raises(McpError) as refused:
            await call(old, "echo", {"text": "old again"})
        assert refused.value.code == "connect_failed" and "another holder" in refused.value.message
        await new.stop()  # releases the lease: the old holder may take it back
        await sync_to_async(
            lambda: Holder.objects.filter(name="host:1:old").update(heartbeat_at=timezone.now())
        )()
        assert value(await call(old, "echo", {"text": "old again"})) == "old again"
        assert not old.lost
    finally:
        await old.stop()
        await new.stop()
    leased = await sync_to_async(
        lambda: list(AuditEvent.objects.filter(verb="server.stdio_leased").values_list("data", flat=True))
    )()
    assert leased[-2] == {"server": server.slug, "holder": "host:2:new", "taken_from": "host:1:old"}
    assert leased[-1] == {"server": server.slug, "holder": "host:1:old"}
    holder = await sync_to_async(lambda: McpServer.objects.get(pk=server.pk).stdio_holder)()
    assert holder is None


async def test_a_disabled_server_is_not_leased() -> None:
    server = await sync_to_async(make_server)(enabled=False)
    supervisor = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:1:a")).name)
    assert not await supervisor.start()
    await supervisor.stop()


async def test_the_session_is_probed_at_start_and_its_tools_stored_before_the_first_call() -> None:
    server = await sync_to_async(make_server)()
    supervisor = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:1:a")).name)
    try:
        # Never started: the first session starts it (taking the lease).
        assert value(await call(supervisor, "echo", {"text": "first"})) == "first"
        stored = await sync_to_async(McpServer.objects.get)(pk=server.pk)
        assert stored.stdio_holder_id is not None
        assert stored.probe["ok"] and stored.probe["era"] == "handshake"
        assert stored.probe["server_info"]["name"] == "elicit-hub-stdio-test-server"
        assert {"echo", "crash", "ask"} <= {tool["name"] for tool in stored.tools}
        assert stored.probe["tool_count"] == len(stored.tools)
        probed = await sync_to_async(
            lambda: AuditEvent.objects.filter(verb="server.probed").values_list("data", flat=True).first()
        )()
        assert probed["server"] == server.slug and probed["ok"]
    finally:
        await supervisor.stop()


async def test_era_auto_speaks_to_the_stdio_server_in_whatever_era_it_offers() -> None:
    server = await sync_to_async(make_server)(slug="auto-tools")
    await sync_to_async(McpServer.objects.filter(pk=server.pk).update)(era=McpServer.Era.AUTO)
    supervisor = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:1:a")).name)
    try:
        assert value(await call(supervisor, "echo", {"text": "auto"})) == "auto"
        stored = await sync_to_async(McpServer.objects.get)(pk=server.pk)
        assert stored.probe["ok"] and stored.probe["era"] in {"handshake", "2026-07-28"}
    finally:
        await supervisor.stop()


async def test_a_command_that_exits_at_once_is_retried_and_the_call_is_refused_as_not_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await sync_to_async(make_server)(slug="broken")
    await sync_to_async(McpServer.objects.filter(pk=server.pk).update)(
        args=["-c", "import sys; print('missing config file', file=sys.stderr); sys.exit(2)"]
    )
    caplog.set_level(logging.INFO, logger="approvals.stdio.broken")
    supervisor = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:1:a")).name)
    try:
        with pytest.raises(McpError) as refused:
            await call_briefly(supervisor)
        assert refused.value.code == "connect_failed" and refused.value.transient
        assert "missing config file" in [r.getMessage() for r in caplog.records]
        assert supervisor.running  # it keeps trying, with a backoff
        stored = await sync_to_async(McpServer.objects.get)(pk=server.pk)
        assert not stored.probe["ok"] and stored.probe["error"]["code"] == "not_running"
        assert "approvals.stdio.broken" in stored.probe["hint"]
    finally:
        await supervisor.stop()


async def call_briefly(supervisor: StdioSupervisor) -> Any:
    async with supervisor.session(wait=3) as (client, dispatcher):
        return await call_on(client, dispatcher, SessionHooks(elicit=no_elicit), "echo", {}, timeout=5)


HOLDER_SCRIPT = """
import asyncio, sys
import django
django.setup()
from mcp import Client
from mcp.client.stdio import stdio_client
from approvals.holder.stdio import RunAs, server_parameters, working_dir
from approvals.services.stdio import Launch

async def main():
    run_as = RunAs.configured()
    launch = Launch(slug="orphan", command=sys.executable, args=[sys.argv[1]])
    params = server_parameters(launch, working_dir("orphan", run_as), run_as)
    async with Client(stdio_client(params), mode="legacy") as client:
        where = await client.call_tool("where", {})
        print(where.content[0].text.replace(chr(10), " "), flush=True)
        await client.call_tool("block", {"seconds": 600})

asyncio.run(main())
"""


async def test_the_server_dies_with_its_holder_even_if_it_ignores_its_closed_stdin(_stdio_dir: Path) -> None:
    """The holder is SIGKILLed while the server is blocked (it would never read the EOF on its stdin): the
    parent-death signal ends it, so a holder that takes over the lease never runs a second copy beside it."""
    import subprocess

    from tests.live import child_env

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, str(SERVER_SCRIPT)],
        env=child_env(ELICIT_STDIO_DIR=str(_stdio_dir)),
        stdout=subprocess.PIPE,
        text=True,
    )
    pid = 0
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        pid = int(json.loads(line)["pid"])
        assert Path(f"/proc/{pid}").exists()
        holder.kill()
        holder.wait()
        for _ in range(200):
            if not _alive(pid):
                break
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        holder.kill()
        holder.wait()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def test_a_tool_list_change_between_calls_updates_the_stored_tools(
    running: tuple[McpServer, StdioSupervisor],
) -> None:
    server, supervisor = running
    assert value(await call(supervisor, "grow", {"name": "brand_new"})) == "growing"

    def names() -> set[str]:
        return {tool["name"] for tool in McpServer.objects.get(pk=server.pk).tools or []}

    for _ in range(100):
        if "brand_new" in await sync_to_async(names)():
            break
        await stdio_holder.asyncio.sleep(0.1)
    assert "brand_new" in await sync_to_async(names)()
    changed = await sync_to_async(
        lambda: list(AuditEvent.objects.filter(verb="server.tools_refreshed").values_list("data", flat=True))
    )()
    assert changed[-1]["why"] == "list_changed" and "brand_new" in changed[-1]["tools"]
    assert value(await call(supervisor, "brand_new")) == "new"


async def test_a_working_directory_the_user_cannot_reach_is_named_in_the_probe(_stdio_dir: Path) -> None:
    closed = _stdio_dir.parent / "closed"
    closed.mkdir(mode=0o700, parents=True)
    try:
        stranger = stdio_holder.RunAs(name="stranger", uid=os.geteuid() + 4242, gid=os.getegid() + 4242)
        (closed / "inner").mkdir(mode=0o755)
        assert stdio_holder._untraversable(closed / "inner", stranger) == closed
        os.chmod(closed, 0o701)
        assert stdio_holder._untraversable(closed / "inner", stranger) is None
        os.chmod(closed, 0o700)
        if os.geteuid() == 0:  # a root hub runs the server as ELICIT_STDIO_USER: the start fails, saying why
            settings.ELICIT_STDIO_DIR = closed / "stdio"
            server = await sync_to_async(make_server)(slug="unreachable")
            supervisor = StdioSupervisor(server.pk, (await sync_to_async(make_holder)("host:1:a")).name)
            try:
                with pytest.raises(McpError):
                    await call_briefly(supervisor)
            finally:
                await supervisor.stop()
            stored = await sync_to_async(McpServer.objects.get)(pk=server.pk)
            assert stored.probe["error"]["code"] == "not_running"
            expected = f"cannot reach {closed / 'stdio'}: {closed} has no execute permission"
            assert expected in stored.probe["error"]["message"]
    finally:
        shutil.rmtree(closed, ignore_errors=True)


def test_a_working_directory_left_by_an_earlier_server_of_the_same_slug_is_emptied_for_the_next(
    _stdio_dir: Path,
) -> None:
    """A server deleted and another registered under its slug: the new program must not inherit the old
    one's HOME (what it cached there: tokens, credentials). The same server keeps its own across starts."""
    from approvals.holder.stdio import working_dir

    first = working_dir("tools", None, server_id=7)
    (first / ".cache").mkdir()
    (first / ".cache" / "token").write_text("old server's token")
    assert working_dir("tools", None, server_id=7) == first
    assert (first / ".cache" / "token").read_text() == "old server's token"  # its own, kept

    again = working_dir("tools", None, server_id=8)
    assert again == first and again.is_dir() and list(again.iterdir()) == []
    # The mark is the hub's, beside the directory: the server, whose HOME it is, cannot write it.
    assert (_stdio_dir / ".tools.server").read_text().strip() == "8"
    assert not any(path.name.endswith(".server") for path in again.iterdir())


def test_a_working_directory_from_before_the_mark_is_kept_for_its_server(_stdio_dir: Path) -> None:
    from approvals.holder.stdio import working_dir

    legacy = working_dir("tools", None)  # as made before directories were marked
    (legacy / "settings.json").write_text("{}")
    assert (working_dir("tools", None, server_id=3) / "settings.json").exists()
    assert (_stdio_dir / ".tools.server").read_text().strip() == "3"
