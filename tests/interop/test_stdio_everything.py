"""server-everything as a stdio server run by the hub's supervisor: registered by command and arguments,
started unprivileged in its own directory under ./var, its session used for one call after another."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import Completed
from approvals.mcp_client.session import SessionHooks, call_on
from approvals.models import Holder, McpServer
from elicit_hub import engines
from tests.interop.conftest import everything_stdio_command

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.usefixtures("live_db", "interop_installed"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture(autouse=True)
def _stdio_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex
    monkeypatch.setattr(settings, "ELICIT_STDIO_DIR", root, raising=False)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _register() -> tuple[McpServer, Holder]:
    command, args = everything_stdio_command()
    server = McpServer.objects.create(
        slug="everything-stdio",
        name="server-everything (stdio)",
        transport=McpServer.Transport.STDIO,
        command=command,
        args=args,
        era=McpServer.Era.AUTO,
    )
    return server, Holder.objects.create(name="host:1:interop")


@pytest.fixture
async def supervisor() -> AsyncIterator[StdioSupervisor]:
    server, holder = await sync_to_async(_register)()
    running = StdioSupervisor(server.pk, holder.name)
    assert await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def _never(params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError(f"no elicitation expected: {params}")


def _text(outcome: Any) -> str:
    assert isinstance(outcome, Completed), outcome
    return "\n".join(c.get("text", "") for c in outcome.result["content"])


async def test_echo_an_answered_elicitation_and_progress_on_one_stdio_session(
    supervisor: StdioSupervisor,
) -> None:
    async with supervisor.session(wait=30) as (client, dispatcher):
        echo = await call_on(
            client, dispatcher, SessionHooks(elicit=_never), "echo", {"message": "hi"}, timeout=30
        )
    assert _text(echo) == "Echo: hi"

    typed = {"name": "Grace Hopper", "integer": 7}
    asked: list[dict[str, Any]] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"action": "accept", "content": typed}

    async with supervisor.session(wait=30) as (client, dispatcher):
        outcome = await call_on(
            client, dispatcher, SessionHooks(elicit=elicit), "trigger-elicitation-request", {}, timeout=30
        )
    text = _text(outcome)
    assert "- Name: Grace Hopper" in text and "- Favorite Integer: 7" in text
    assert json.dumps({"action": "accept", "content": typed}, indent=2) in text
    assert asked[0]["requestedSchema"]["required"] == ["name"]

    seen: list[tuple[float, float | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total))

    async with supervisor.session(wait=30) as (client, dispatcher):
        hooks = SessionHooks(elicit=_never, progress=progress)
        long = await call_on(
            client,
            dispatcher,
            hooks,
            "trigger-long-running-operation",
            {"duration": 3, "steps": 3},
            timeout=30,
        )
    assert _text(long) == "Long running operation completed. Duration: 3 seconds, Steps: 3."
    assert seen == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_decline_and_cancel_reach_server_everything_over_stdio(
    supervisor: StdioSupervisor, action: str
) -> None:
    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        return {"action": action}

    async with supervisor.session(wait=30) as (client, dispatcher):
        outcome = await call_on(
            client, dispatcher, SessionHooks(elicit=elicit), "trigger-elicitation-request", {}, timeout=30
        )
    assert json.dumps({"action": action}, indent=2) in _text(outcome)
