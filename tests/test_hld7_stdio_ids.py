"""A stdio server that misuses JSON-RPC ids: it answers one tools/call twice, asks questions under ids that
are no JSON-RPC ids (null, an object, a float) or under the id of the call it is answering, and asks two
questions at once under one id. Real parts: the raw JSON-RPC server tests/hld7_raw_server.py, the supervisor
that runs it, PostgreSQL (its lease)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import Completed
from approvals.mcp_client.session import SessionHooks, call_on
from approvals.models import Holder, McpServer
from tests.test_stdio import _stdio_dir, anyio_backend

SCRIPT = Path(__file__).resolve().parent / "hld7_raw_server.py"
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("live_db")]
__all__ = ["_stdio_dir", "anyio_backend"]  # the fixtures of tests/test_stdio.py, used here too


async def _running(behaviour: str) -> StdioSupervisor:
    server = await sync_to_async(McpServer.objects.create)(
        slug="hld7-ids",
        name="hld7-ids",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(SCRIPT)],
        env={"BEHAVIOUR": behaviour},
        era=McpServer.Era.HANDSHAKE,
    )
    holder = await sync_to_async(Holder.objects.create)(name="host:1:hld7", heartbeat_at=timezone.now())
    supervisor = StdioSupervisor(server.pk, holder.name)
    assert await supervisor.start()
    return supervisor


async def _calls(supervisor: StdioSupervisor, asked: list[dict[str, Any]]) -> list[str]:
    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        await asyncio.sleep(0.2)
        return {"action": "accept", "content": {"go": True}}

    texts = []
    for name in ("act", "echo", "echo"):
        async with supervisor.session(wait=20) as (client, dispatcher):
            outcome = await call_on(client, dispatcher, SessionHooks(elicit=elicit), name, {}, timeout=15)
        assert isinstance(outcome, Completed), outcome
        texts.append(str(outcome.result["content"][0]["text"]))
    return texts


@pytest.mark.parametrize(
    ("behaviour", "first", "questions"),
    [
        ("twice", "first", 0),  # the second answer to the same request is dropped
        ("ask_ids", "done", 1),  # only the question under a real id (the call's own) is asked
        # Both asked; the server has at least the first answer (the second may come before it reads).
        ("ask_same_id", '[{"action": "accept", "content": {"go": true}}', 2),
    ],
)
async def test_a_server_misusing_ids_keeps_its_session_and_its_next_calls_work(
    behaviour: str, first: str, questions: int
) -> None:
    supervisor = await _running(behaviour)
    asked: list[dict[str, Any]] = []
    try:
        texts = await _calls(supervisor, asked)
        assert texts[0].startswith(first) and texts[1:] == ["ok", "ok"], texts
        await asyncio.sleep(0.5)  # a question still on its way would be counted
        assert len(asked) == questions
        assert supervisor.restarts == 0
    finally:
        await supervisor.stop()
