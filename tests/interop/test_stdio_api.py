"""server-everything over stdio through the whole hub: registered by an admin with `add_server --command`,
run by a real holder process (its stdio supervisor), called by an agent through the API, its elicitation
answered by a reviewer through the API, its long-running tool's progress stored on the call."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from approvals.models import McpServer, Membership, Round, ToolCall
from approvals.services import tokens
from elicit_hub import engines
from tests import factories
from tests.hub import Agent, Reviewer
from tests.interop.conftest import everything_stdio_command
from tests.live import HolderRunner, child_env, wait_until

pytestmark = [pytest.mark.usefixtures("interop_installed"), pytest.mark.timeout(240)]

FINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture
def holder(live_db: None) -> Iterator[HolderRunner]:
    stdio_dir = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex
    runner = HolderRunner(
        child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_STDIO_DIR=str(stdio_dir))
    ).start()
    try:
        yield runner
    finally:
        runner.stop()
        shutil.rmtree(stdio_dir, ignore_errors=True)


def _finished(agent: Agent, call_id: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        call = agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in FINAL else None

    return wait_until(done, timeout, 0.2, what=f"call {call_id} to end")  # type: ignore[return-value]


def _text(body: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in body["result"]["content"])


def test_a_stdio_server_everything_serves_calls_elicitations_and_progress_through_the_api(
    worker: Any, holder: HolderRunner
) -> None:
    alice = factories.user("alice")
    factories.team("release", (alice, Membership.Role.REVIEWER))
    command, args = everything_stdio_command()
    call_command(
        "add_server", "everything", "--command", command, *(f"--arg={a}" for a in args), "--team", "release"
    )
    server = McpServer.objects.get(slug="everything")
    assert server.transport == McpServer.Transport.STDIO and server.needs_session
    _, agent_token = tokens.agent_create(name="stdio-agent", servers=[server])
    _, reviewer_token = tokens.personal_token_create(user=alice)
    agent, reviewer = Agent(agent_token), Reviewer(reviewer_token)

    # A plain tool.
    body = _finished(agent, agent.call("echo", {"message": "over stdio"}, server="everything"))
    assert body["status"] == "completed", body
    assert _text(body) == "Echo: over stdio"

    # The server's question reaches the inbox; the reviewer's typed answer reaches the server.
    call_id = agent.call("trigger-elicitation-request", {}, server="everything")
    item = reviewer.wait_for_request(call_id, "elicitation")
    assert item["mode"] == "form"
    assert Round.objects.get(call_id=call_id).kind == Round.Kind.PUSH
    typed = {"name": "Grace Hopper", "check": True, "integer": 7}
    response = reviewer.respond(item["id"], "accept", typed)
    assert response.status_code == 200, response.content
    body = _finished(agent, call_id)
    assert body["status"] == "completed", body
    assert '"action": "accept"' in _text(body) and "- Name: Grace Hopper" in _text(body), _text(body)

    # A long-running tool reports progress while it runs, and completes once.
    call_id = agent.call("trigger-long-running-operation", {"duration": 6, "steps": 6}, server="everything")

    def reported() -> bool:
        progress = ToolCall.objects.get(pk=call_id).progress or {}
        return progress.get("total") == 6 and 0 < progress.get("progress", 0) < 6

    wait_until(reported, 30, 0.1, what="progress of the stdio call")
    body = _finished(agent, call_id)
    assert body["status"] == "completed", body
    assert _text(body) == "Long running operation completed. Duration: 6 seconds, Steps: 6."
    assert body["progress"]["total"] == 6
    assert ToolCall.objects.get(pk=call_id).attempts <= 1
