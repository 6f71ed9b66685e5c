"""A stdio server's lease taken over from a holder that died without stopping (SIGKILL): the holder that takes
it ends the dead holder's calls on the server as beat's sweep would, without waiting for the sweep. Real
parts: ``manage.py run_holder`` running a real stdio MCP server (tests/stdio_test_server.py), the supervisors
that take its lease over, PostgreSQL."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import Completed
from approvals.mcp_client.session import SessionHooks, call_on
from approvals.models import AuditEvent, Holder, McpServer, ToolCall
from approvals.services import holding
from elicit_hub import engines
from tests import factories
from tests.live import HolderRunner, child_env

SERVER_SCRIPT = Path(__file__).resolve().parent / "stdio_test_server.py"

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def stdio_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex
    root.mkdir(parents=True)
    monkeypatch.setattr(settings, "ELICIT_STDIO_DIR", root, raising=False)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _server() -> McpServer:
    return McpServer.objects.create(
        slug="std4-tools",
        name="std4-tools",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(SERVER_SCRIPT)],
        era=McpServer.Era.HANDSHAKE,
        call_timeout=600,
    )


async def _eventually(predicate: Any, timeout: float, what: str) -> Any:
    """Poll `predicate` (run in a thread: it reads the database) until it gives something true."""
    with anyio.move_on_after(timeout):
        while not (found := await sync_to_async(predicate)()):
            await anyio.sleep(0.1)
    assert found, f"timed out after {timeout:.0f} s waiting for {what}"
    return found


async def _no_elicit(params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("no elicitation expected")


async def test_a_killed_holders_stdio_lease_is_taken_over_and_its_calls_end_as_the_sweep_ends_them(
    live_db: None, stdio_root: Path
) -> None:
    server = await sync_to_async(_server)()
    env = child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_STDIO_DIR=str(stdio_root))
    dead = await sync_to_async(HolderRunner(env, name="std4-dead").start)()
    try:
        sent = await sync_to_async(factories.call)(server, tool="block", arguments={"seconds": 600})
        await sync_to_async(holding.notify)()
        # The call reached the server (its tool runs), then the holder dies without stopping.
        await _eventually(
            lambda: ToolCall.objects.filter(pk=sent.pk, started_at__isnull=False).exists(), 60, "the send"
        )
        assert dead.proc is not None
        dead.proc.send_signal(signal.SIGKILL)
        await sync_to_async(dead.proc.wait)(timeout=30)
    finally:
        await sync_to_async(dead.stop)()
    old = await sync_to_async(Holder.objects.get)(stdio_servers=server)
    # A call it had claimed and not sent yet.
    unsent = await sync_to_async(factories.call)(
        server, tool="echo", arguments={"text": "later"}, holder=old, status=ToolCall.Status.RUNNING
    )
    # Its heartbeat goes stale; beat's sweep does not run.
    stale = timezone.now() - timedelta(seconds=settings.ELICIT_HOLDER_STALE + 5)
    await sync_to_async(Holder.objects.filter(pk=old.pk).update)(heartbeat_at=stale)

    first = await sync_to_async(Holder.objects.create)(name="host:1:std4")
    second = await sync_to_async(Holder.objects.create)(name="host:2:std4")
    supervisors = [StdioSupervisor(server.pk, first.name), StdioSupervisor(server.pk, second.name)]
    try:
        won = await asyncio.gather(*(supervisor.start() for supervisor in supervisors))
        assert sorted(won) == [False, True]  # one holder takes the lease over
        winner = supervisors[won.index(True)]
        async with winner.session(wait=30) as (client, dispatcher):
            outcome = await call_on(
                client, dispatcher, SessionHooks(elicit=_no_elicit), "echo", {"text": "here"}, timeout=30
            )
        assert isinstance(outcome, Completed)
    finally:
        for supervisor in supervisors:
            await supervisor.stop()

    # The sent call fails as the sweep fails it: it may have run and is never sent again; the unsent one is
    # queued again for any holder. The dead holder was not swept meanwhile.
    ended = await sync_to_async(ToolCall.objects.get)(pk=sent.pk)
    assert ended.status == ToolCall.Status.FAILED and ended.error is not None and ended.holder_id is None
    assert ended.error["code"] == "holder_lost" and ended.error["tool_may_have_run"] is True
    assert old.name in ended.error["message"]
    requeued = await sync_to_async(ToolCall.objects.get)(pk=unsent.pk)
    assert requeued.status == ToolCall.Status.QUEUED and requeued.holder_id is None
    assert requeued.started_at is None
    assert await sync_to_async(Holder.objects.filter(pk=old.pk, heartbeat_at=stale).exists)()
    leased = await sync_to_async(
        lambda: list(AuditEvent.objects.filter(verb="server.stdio_leased").values_list("data", flat=True))
    )()
    assert leased[-1] == {"server": server.slug, "holder": winner.holder_name, "taken_from": old.name}
    failed = await sync_to_async(
        lambda: list(AuditEvent.objects.filter(call_id=sent.pk).values_list("verb", flat=True))
    )()
    assert failed.count("call.failed") == 1


async def test_a_live_holder_takes_a_dead_holders_stdio_server_over_without_the_sweep(
    live_db: None, stdio_root: Path
) -> None:
    """Two real holders: the one running the server is killed; the other claims the server's next call as
    soon as the dead one's heartbeat is stale, takes the lease over and runs it. Beat's sweep never runs."""
    server = await sync_to_async(_server)()
    env = child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_STDIO_DIR=str(stdio_root))
    dead = await sync_to_async(HolderRunner(env, name="std4-a").start)()
    other = None
    try:
        sent = await sync_to_async(factories.call)(server, tool="block", arguments={"seconds": 600})
        await sync_to_async(holding.notify)()
        await _eventually(
            lambda: ToolCall.objects.filter(pk=sent.pk, started_at__isnull=False).exists(), 60, "the send"
        )
        old = await sync_to_async(Holder.objects.get)(stdio_servers=server)
        other = await sync_to_async(HolderRunner(env, name="std4-b").start)()
        waiting = await sync_to_async(factories.call)(server, tool="echo", arguments={"text": "after"})
        assert dead.proc is not None
        dead.proc.send_signal(signal.SIGKILL)
        await sync_to_async(dead.proc.wait)(timeout=30)
        stale = timezone.now() - timedelta(seconds=settings.ELICIT_HOLDER_STALE + 5)
        await sync_to_async(Holder.objects.filter(pk=old.pk).update)(heartbeat_at=stale)
        await sync_to_async(holding.notify)()

        done = await _eventually(
            lambda: ToolCall.objects.filter(pk=waiting.pk, status=ToolCall.Status.COMPLETED).first(),
            60,
            "the waiting call to run on the other holder",
        )
        assert done.result["content"][0]["text"] == "after"
        ended = await sync_to_async(ToolCall.objects.get)(pk=sent.pk)
        assert ended.status == ToolCall.Status.FAILED and ended.error is not None
        assert ended.error["code"] == "holder_lost" and ended.error["tool_may_have_run"] is True
        assert await sync_to_async(Holder.objects.filter(pk=old.pk).exists)()  # not swept meanwhile
        taken = await sync_to_async(
            lambda: list(
                AuditEvent.objects.filter(verb="server.stdio_leased", data__taken_from=old.name).values_list(
                    "data", flat=True
                )
            )
        )()
        assert len(taken) == 1
    finally:
        await sync_to_async(dead.stop)()
        if other is not None:
            await sync_to_async(other.stop)()
