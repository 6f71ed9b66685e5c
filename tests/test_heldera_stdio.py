"""stdio servers that misbehave between calls: one that repeats its credentials in an error, one that says its
tools changed without end.

Real parts: a stdio server process speaking raw JSON-RPC (its code below, run as ``python -c``: no SDK, so it
can do what SDK servers never do), the supervisor that runs it, and PostgreSQL.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from approvals.holder import stdio as stdio_holder
from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import Completed, McpError
from approvals.mcp_client.session import SessionHooks, call_on
from approvals.models import AuditEvent, Holder, McpServer
from tests.test_stdio import _stdio_dir, anyio_backend

TOKEN = "tok-3f9c2a71d5e84b06"
SERVER = r"""
import json, os, sys, threading, time

behaviour = os.environ["BEHAVIOUR"]
lists = 0
out = threading.Lock()


def send(message):
    with out:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def later(seconds, message):
    time.sleep(seconds)
    send(message)


def storm():
    while True:  # "my tools changed", fifty times a second, for ever
        time.sleep(0.02)
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})


for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "raw", "version": "1"},
        }})
    elif method == "tools/list":
        lists += 1
        if behaviour == "list_fails":
            send({"jsonrpc": "2.0", "id": ident, "error": {
                "code": -32603, "message": "the upstream refused the key " + os.environ["API_TOKEN"],
            }})
            continue
        tool = {"name": f"tool_{lists}", "inputSchema": {"type": "object"}}
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [tool]}})
        if behaviour == "storm" and lists == 1:
            threading.Thread(target=storm, daemon=True).start()
    elif method == "tools/call" and message["params"]["name"] == "stubborn":
        # Never answers, ignores notifications/cancelled, and asks a question a second later.
        schema = {"type": "object", "properties": {}}
        question = {"message": "A question of the abandoned call", "requestedSchema": schema}
        ask = {"jsonrpc": "2.0", "id": "late-1", "method": "elicitation/create", "params": question}
        threading.Thread(target=later, args=(1.0, ask), daemon=True).start()
    elif method == "tools/call":
        done = {"content": [{"type": "text", "text": "slow done"}]}
        answer = {"jsonrpc": "2.0", "id": ident, "result": done}
        threading.Thread(target=later, args=(2.5, answer), daemon=True).start()
    elif ident is not None and method is not None:
        send({"jsonrpc": "2.0", "id": ident, "result": {}})
"""

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("live_db")]


__all__ = ["_stdio_dir", "anyio_backend"]  # the fixtures of tests/test_stdio.py, used here too


def _server(behaviour: str) -> McpServer:
    return McpServer.objects.create(
        slug="raw",
        name="Raw",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-c", SERVER],
        env={"API_TOKEN": TOKEN, "BEHAVIOUR": behaviour},
        era=McpServer.Era.HANDSHAKE,
    )


async def _running(behaviour: str) -> tuple[McpServer, StdioSupervisor]:
    server = await sync_to_async(_server)(behaviour)
    holder = await sync_to_async(Holder.objects.create)(name="host:1:a", heartbeat_at=timezone.now())
    supervisor = StdioSupervisor(server.pk, holder.name)
    assert await supervisor.start()
    return server, supervisor


def _events(verb: str) -> list[dict[str, Any]]:
    return list(AuditEvent.objects.filter(verb=verb).order_by("pk").values_list("data", flat=True))


async def test_a_stdio_servers_credential_in_its_probe_error_is_neither_stored_nor_audited() -> None:
    server, supervisor = await _running("list_fails")
    try:
        with anyio.fail_after(20):
            while not (await sync_to_async(McpServer.objects.get)(pk=server.pk)).probe:
                await anyio.sleep(0.1)
    finally:
        await supervisor.stop()
    probe = (await sync_to_async(McpServer.objects.get)(pk=server.pk)).probe
    assert probe is not None and probe["ok"] is False
    assert "the upstream refused the key" in probe["error"]["message"]
    assert TOKEN not in json.dumps(probe)
    audited = await sync_to_async(_events)("server.probed")
    assert audited and TOKEN not in json.dumps(audited)


async def test_a_server_that_says_its_tools_changed_without_end_is_listed_at_a_bounded_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stdio_holder, "RELIST_EVERY", 1.0, raising=False)
    server, supervisor = await _running("storm")
    try:

        def listed() -> int:
            return sum(e.get("why") == "list_changed" for e in _events("server.tools_refreshed"))

        with anyio.fail_after(20):
            while not await sync_to_async(listed)():
                await anyio.sleep(0.05)
        before = await sync_to_async(listed)()
        await anyio.sleep(3)
        during = await sync_to_async(listed)() - before
        tools = (await sync_to_async(McpServer.objects.get)(pk=server.pk)).tools
    finally:
        await supervisor.stop()
    assert 2 <= during <= 4, during  # one listing a second, not one per notice
    assert tools and tools[0]["name"].startswith("tool_")


async def test_a_question_from_a_call_that_ended_without_its_answer_never_reaches_the_next_call() -> None:
    _, supervisor = await _running("stubborn")
    asked: list[dict[str, Any]] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"action": "decline"}

    try:
        with pytest.raises(McpError) as abandoned:
            async with supervisor.session(wait=30) as (client, dispatcher):
                await call_on(client, dispatcher, SessionHooks(elicit=elicit), "stubborn", {}, timeout=0.5)
        assert abandoned.value.code == "outcome_unknown"
        async with supervisor.session(wait=30) as (client, dispatcher):
            outcome = await call_on(client, dispatcher, SessionHooks(elicit=elicit), "slow", {}, timeout=30)
    finally:
        await supervisor.stop()
    assert isinstance(outcome, Completed)
    assert outcome.result["content"][0]["text"] == "slow done"
    assert asked == []  # the stubborn tool's question did not become the slow call's
    assert supervisor.restarts == 1
