"""stdio servers that misbehave on their own stdout: a line that is not JSON-RPC (holding a credential), a
line longer than the hub accepts from any server. Real parts: a real stdio MCP server process
(tests/hdrev_stdio_server.py, on the `mcp` SDK), the supervisor that runs it, its lease in PostgreSQL."""

from __future__ import annotations

import logging
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import Completed, McpError
from approvals.mcp_client.session import SessionHooks, call_on
from approvals.models import Holder, McpServer
from elicit_hub import engines

SERVER_SCRIPT = Path(__file__).resolve().parent / "hdrev_stdio_server.py"
SECRET = "tok-hdrev-5f1c2a9e7b3d48e6a0c1"
KEY_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"  # a line of a PEM key
PEM = f"-----BEGIN PRIVATE KEY-----\n{KEY_BODY}\n-----END PRIVATE KEY-----\n"
MAX_LINE = 64 * 1024  # the hub's limit on a server's answer here (ELICIT_MAX_MCP_RESPONSE)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("live_db")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _stdio_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex
    monkeypatch.setattr(settings, "ELICIT_STDIO_DIR", root, raising=False)
    monkeypatch.setattr(settings, "ELICIT_MAX_MCP_RESPONSE", MAX_LINE, raising=False)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _make_server(env: dict[str, str]) -> McpServer:
    return McpServer.objects.create(
        slug="hdrev-tools",
        name="hdrev-tools",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(SERVER_SCRIPT)],
        env=env,
        era=McpServer.Era.HANDSHAKE,
    )


async def _no_elicit(params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("no elicitation expected")


async def _call(supervisor: StdioSupervisor, name: str, arguments: dict[str, Any]) -> Any:
    async with supervisor.session(wait=30) as (client, dispatcher):
        return await call_on(client, dispatcher, SessionHooks(elicit=_no_elicit), name, arguments, timeout=30)


def _text(outcome: Any) -> str:
    assert isinstance(outcome, Completed), outcome
    return str(outcome.result["content"][0]["text"])


@pytest.fixture
async def running() -> AsyncIterator[tuple[McpServer, StdioSupervisor]]:
    server = await sync_to_async(_make_server)({"API_TOKEN": SECRET, "PEM": PEM})
    holder = await sync_to_async(Holder.objects.create)(name="host:1:hdrev", heartbeat_at=timezone.now())
    assert holder.heartbeat_at > timezone.now() - timedelta(seconds=5)
    supervisor = StdioSupervisor(server.pk, holder.name)
    assert await supervisor.start()
    try:
        yield server, supervisor
    finally:
        await supervisor.stop()


async def test_a_line_on_stdout_that_is_not_json_rpc_is_dropped_and_its_text_never_logged(
    running: tuple[McpServer, StdioSupervisor], caplog: pytest.LogCaptureFixture
) -> None:
    _, supervisor = running
    caplog.set_level(logging.DEBUG)
    assert _text(await _call(supervisor, "garbage", {"name": "API_TOKEN"})) == "ok"
    # The session goes on: the next call on the same process works.
    assert _text(await _call(supervisor, "echo", {"text": "still here"})) == "still here"
    assert supervisor.restarts == 0
    logged = "\n".join(
        f"{record.getMessage()} {record.exc_text or ''} {record.exc_info or ''}" for record in caplog.records
    )
    assert SECRET[:12] not in logged
    assert "is not a JSON-RPC message" in logged


async def test_a_line_longer_than_the_limit_ends_the_session_and_the_server_is_restarted(
    running: tuple[McpServer, StdioSupervisor], caplog: pytest.LogCaptureFixture
) -> None:
    _, supervisor = running
    caplog.set_level(logging.WARNING)
    # 64 times the limit: the hub reads no further than the limit, ends the session, and the call fails at
    # once (the tool ran: what it answered is lost), not at its time limit.
    with pytest.raises(McpError) as failure:
        await _call(supervisor, "huge", {"size": 64 * MAX_LINE})
    assert failure.value.code == "network_error"
    assert "closed before tools/call 'huge' was answered" in failure.value.message
    # The server is started again, and its next call works.
    assert _text(await _call(supervisor, "echo", {"text": "again"})) == "again"
    assert supervisor.restarts == 1
    assert supervisor.last_exit == f"it wrote a line longer than {MAX_LINE} bytes to its stdout"
    assert any(f"longer than {MAX_LINE} bytes" in record.getMessage() for record in caplog.records)


async def test_a_credential_over_several_lines_is_replaced_in_every_stderr_line(
    running: tuple[McpServer, StdioSupervisor], caplog: pytest.LogCaptureFixture
) -> None:
    server, supervisor = running
    caplog.set_level(logging.INFO, logger=f"approvals.stdio.{server.slug}")
    assert _text(await _call(supervisor, "confess", {"name": "PEM"})) == "ok"
    assert _text(await _call(supervisor, "confess", {"name": "API_TOKEN"})) == "ok"

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == f"approvals.stdio.{server.slug}"]

    # stderr is a pipe of its own: its lines may reach the log a moment after the answer.
    with anyio.fail_after(10):
        # The one-line value's line, and the key's last line.
        while "my secret: [redacted]" not in lines() or sum("PRIVATE" in line for line in lines()) < 2:
            await anyio.sleep(0.05)
    logged = "\n".join(lines())
    assert KEY_BODY[:16] not in logged, logged
    assert "\n[redacted]\n" in logged, logged  # the key's own line
