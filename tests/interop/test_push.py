"""Push elicitation end to end on third-party handshake-era servers: the agent's API, a real Celery worker,
a real holder process keeping each session open, the reviewer's API, and each server's own account of what
it received and how often its tool body ran."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from approvals.models import McpServer, Round, ToolCall
from tests.hub import Hub
from tests.interop.conftest import ThirdPartyServer, register, register_many
from tests.live import HolderRunner, child_env, wait_until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def holder(live_db: None) -> Iterator[HolderRunner]:
    runner = HolderRunner(child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1")).start()
    try:
        yield runner
    finally:
        runner.stop()


# name: (fixture, plain tool, its arguments, its text, the asking tool, its arguments, the typed answer)
SERVERS: dict[str, tuple[str, str, dict[str, Any], str, str, dict[str, Any], dict[str, Any]]] = {
    "everything": (
        "everything_server",
        "echo",
        {"message": "hi there"},
        "Echo: hi there",
        "trigger-elicitation-request",
        {},
        {"name": "Grace Hopper", "check": True, "integer": 7},
    ),
    "fastmcp2": (
        "fastmcp2_server",
        "add",
        {"a": 2, "b": 40},
        "42",
        "book_table",
        {"restaurant": "Chez Ada"},
        {"name": "Grace Hopper", "seats": 4},
    ),
    "mcp23": (
        "mcp23_server",
        "add",
        {"a": 2, "b": 40},
        "42",
        "book_table",
        {"restaurant": "Chez Ada"},
        {"name": "Grace Hopper", "seats": 4},
    ),
    "fastmcp4": (
        "fastmcp4_server",
        "add",
        {"a": 2, "b": 40},
        "42",
        "book_table",
        {"restaurant": "Chez Ada"},
        {"name": "Grace Hopper", "seats": 4},
    ),
}


def _texts(body: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in body["result"]["content"])


def _runs(name: str, server: ThirdPartyServer, tool: str) -> int | None:
    return None if name == "everything" else server.runs().get(tool, 0)


def _finished(hub: Hub, call_id: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(done, timeout, 0.2, what=f"call {call_id} to end")  # type: ignore[return-value]


@pytest.fixture(params=list(SERVERS))
def handshake(
    request: pytest.FixtureRequest, worker: Any, holder: HolderRunner
) -> tuple[str, ThirdPartyServer, Hub]:
    name = request.param
    server: ThirdPartyServer = request.getfixturevalue(SERVERS[name][0])
    # The dual-era servers (mcp 2.3, FastMCP 4) answer 2026-07-28 too: their ctx.elicit() tools need the
    # handshake era, chosen per server as an admin would.
    return name, server, register(server.url, name, McpServer.Era.HANDSHAKE)


def test_plain_tool_completes_on_a_session(handshake: tuple[str, ThirdPartyServer, Hub]) -> None:
    name, server, hub = handshake
    _, tool, arguments, text, *_ = SERVERS[name]
    before = _runs(name, server, tool)
    body = _finished(hub, hub.agent.call(tool, arguments, server=name))
    assert body["status"] == "completed", body
    assert body["rounds"] == []
    assert _texts(body).startswith(text)
    if before is not None:
        assert _runs(name, server, tool) == before + 1


@pytest.mark.parametrize("action", ["accept", "decline", "cancel"])
def test_the_servers_question_reaches_the_inbox_and_the_answer_reaches_the_server(
    handshake: tuple[str, ThirdPartyServer, Hub], action: str
) -> None:
    name, server, hub = handshake
    *_, tool, arguments, typed = SERVERS[name]
    before = _runs(name, server, tool)
    call_id = hub.agent.call(tool, arguments, server=name)

    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    assert item["mode"] == "form"
    assert item["server_name"] == name
    assert item["message"]
    assert item["requested_schema"]["properties"]["name"]["type"] == "string"
    rnd = Round.objects.get(call_id=call_id)
    assert rnd.kind == Round.Kind.PUSH
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.AWAITING_INPUT

    content = typed if action == "accept" else None
    response = hub.reviewer.respond(item["id"], action, content, reason="no" if action == "decline" else "")
    assert response.status_code == 200, response.content

    body = _finished(hub, call_id)
    assert body["status"] == "completed", body
    text = _texts(body)
    if name == "everything":
        assert f'"action": "{action}"' in text, text
        if action == "accept":
            assert "- Name: Grace Hopper" in text and "- Favorite Integer: 7" in text, text
    elif action == "accept":
        assert text == f"accept: {typed}", text
    else:
        assert text == action, text
    if before is not None:
        assert _runs(name, server, tool) == before + 1  # asked once, answered on the same session
    assert hub.reviewer.inbox() == []


LONG = 40  # seconds: longer than the hub's old 30 s cut that re-sent a tool five times


def test_a_40_s_tool_on_each_server_runs_once_and_reports_progress(
    worker: Any,
    holder: HolderRunner,
    everything_server: ThirdPartyServer,
    fastmcp2_server: ThirdPartyServer,
    mcp23_server: ThirdPartyServer,
    fastmcp4_server: ThirdPartyServer,
) -> None:
    servers = {
        "everything": everything_server,
        "fastmcp2": fastmcp2_server,
        "mcp23": mcp23_server,
        "fastmcp4": fastmcp4_server,
    }
    hub = register_many({name: server.url for name, server in servers.items()}, McpServer.Era.HANDSHAKE)
    calls: dict[str, str] = {}
    before = {name: _runs(name, server, "slow_report") for name, server in servers.items()}
    for name in servers:
        if name == "everything":
            tool, arguments = "trigger-long-running-operation", {"duration": LONG, "steps": 10}
        else:
            tool, arguments = "slow_report", {"seconds": LONG}
        calls[name] = hub.agent.call(tool, arguments, server=name)

    # Progress arrives while the tools run, stored on each call.
    for name, call_id in calls.items():
        steps = 10 if name == "everything" else LONG

        def reported(call_id: str = call_id, steps: int = steps) -> bool:
            progress = ToolCall.objects.get(pk=call_id).progress or {}
            return progress.get("total") == steps and 0 < progress.get("progress", 0) < steps

        wait_until(reported, 30, 0.2, what=f"progress of the {name} call")

    for name, call_id in calls.items():
        body = _finished(hub, call_id, timeout=LONG + 60)
        assert body["status"] == "completed", (name, body)
        if name == "everything":
            assert _texts(body) == f"Long running operation completed. Duration: {LONG} seconds, Steps: 10."
        else:
            assert _texts(body) == f"report ready after {LONG} s"
            assert _runs(name, servers[name], "slow_report") == before[name] + 1  # type: ignore[operator]
        assert ToolCall.objects.get(pk=call_id).attempts <= 1


def test_killing_the_holder_mid_wait_ends_the_call_and_the_tool_never_runs_twice(
    worker: Any, holder: HolderRunner, fastmcp2_server: ThirdPartyServer
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import Holder, InputRequest
    from approvals.services import holding

    hub = register(fastmcp2_server.url, "fastmcp2", McpServer.Era.HANDSHAKE)
    McpServer.objects.filter(pk=hub.server.pk).update(elicitation_wait=600)
    before = fastmcp2_server.runs().get("book_table", 0)
    call_id = hub.agent.call("book_table", {"restaurant": "Chez Ada"}, server="fastmcp2")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    holder.kill()

    assert holding.holders_sweep(now=timezone.now() + timedelta(minutes=5)) == 1
    body = _finished(hub, call_id)
    assert body["status"] == "failed", body
    assert body["error"]["code"] == "holder_lost"
    assert InputRequest.objects.get(pk=item["id"]).status == InputRequest.Status.GONE
    gone = hub.reviewer.respond(item["id"], "accept", {"name": "Ada", "seats": 2})
    assert gone.status_code == 409

    # A new holder comes up and polls for work: the lost call is not sent again.
    replacement = HolderRunner(
        child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1"), name="holder-2"
    )
    replacement.start()
    try:
        first = wait_until(lambda: Holder.objects.filter(name__startswith="holder-2").first(), 30)
        beat = first.heartbeat_at  # type: ignore[union-attr]
        wait_until(lambda: Holder.objects.filter(pk=first.pk, heartbeat_at__gt=beat).exists(), 30)  # type: ignore[union-attr]
    finally:
        replacement.stop()
    assert fastmcp2_server.runs().get("book_table", 0) == before + 1
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.FAILED
