"""Third-party servers on revision 2026-07-28, end to end: the agent's API, a real Celery worker, the
reviewer's API, and the server's own count of how often each tool body ran."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from approvals.models import McpServer, ToolCall
from tests.conftest import WORKER_ENV
from tests.interop.conftest import ThirdPartyServer, register
from tests.live import CeleryWorker, child_env, wait_until

pytestmark = pytest.mark.timeout(180)


def _text(body: dict) -> str:
    return body["result"]["content"][0]["text"]


def test_fastmcp4_plain_tool_completes_once(worker, fastmcp4_server: ThirdPartyServer) -> None:
    hub = register(fastmcp4_server.url, "fastmcp4", McpServer.Era.MODERN)
    before = fastmcp4_server.runs().get("add", 0)
    body = hub.agent.wait(hub.agent.call("add", {"a": 2, "b": 40}, server="fastmcp4"))
    assert body["status"] == "completed", body
    assert body["rounds"] == []
    assert body["result"]["isError"] is False
    assert _text(body) == "42"
    assert fastmcp4_server.runs().get("add", 0) == before + 1


def test_fastmcp4_guard_tool_takes_two_rounds_and_the_typed_answers_reach_it(
    worker, fastmcp4_server: ThirdPartyServer
) -> None:
    hub = register(fastmcp4_server.url, "fastmcp4", McpServer.Era.MODERN)
    before = fastmcp4_server.runs().get("approve_transfer", 0)
    call_id = hub.agent.call("approve_transfer", {"amount": 120}, server="fastmcp4")

    account = hub.reviewer.wait_for_request(call_id, "account")
    assert account["message"] == "Which account pays 120?"
    assert account["server_name"] == "fastmcp4"
    assert hub.reviewer.respond(account["id"], "accept", {"account": "ACME-7"}).status_code == 200

    # The second question names the account the reviewer typed: the server read the first answer.
    confirm = hub.reviewer.wait_for_request(call_id, "confirm")
    assert confirm["message"] == "Pay 120 from ACME-7?"
    assert hub.reviewer.respond(confirm["id"], "accept", {"confirm": True}).status_code == 200

    body = hub.agent.wait(call_id)
    assert body["status"] == "completed", body
    assert [r["number"] for r in body["rounds"]] == [1, 2]
    assert body["result"]["isError"] is False
    assert _text(body) == "paid 120 from ACME-7"
    assert fastmcp4_server.runs().get("approve_transfer", 0) == before + 1
    assert hub.reviewer.inbox() == []


@pytest.mark.parametrize(("at", "action"), [("account", "decline"), ("confirm", "cancel")])
def test_fastmcp4_guard_tool_hears_decline_and_cancel(
    worker, fastmcp4_server: ThirdPartyServer, at: str, action: str
) -> None:
    hub = register(fastmcp4_server.url, "fastmcp4", McpServer.Era.MODERN)
    before = fastmcp4_server.runs().get("approve_transfer", 0)
    call_id = hub.agent.call("approve_transfer", {"amount": 5}, server="fastmcp4")
    item = hub.reviewer.wait_for_request(call_id, "account")
    if at == "confirm":
        hub.reviewer.respond(item["id"], "accept", {"account": "ACME-1"})
        item = hub.reviewer.wait_for_request(call_id, "confirm")
    reason = "not this one" if action == "decline" else ""
    assert hub.reviewer.respond(item["id"], action, reason=reason).status_code == 200

    body = hub.agent.wait(call_id)
    assert body["status"] == "completed", body
    assert body["result"]["isError"] is True
    question = "account question" if at == "account" else "confirmation"
    assert _text(body) == f"transfer stopped at the {question}: {action}"
    assert fastmcp4_server.runs().get("approve_transfer", 0) == before


def test_mcp23_plain_tool_completes_over_2026_07_28(worker, mcp23_server: ThirdPartyServer) -> None:
    hub = register(mcp23_server.url, "mcp23", McpServer.Era.MODERN)
    before = mcp23_server.runs().get("add", 0)
    body = hub.agent.wait(hub.agent.call("add", {"a": 20, "b": 22}, server="mcp23"))
    assert body["status"] == "completed", body
    assert body["result"]["isError"] is False
    assert _text(body) == "42"
    assert mcp23_server.runs().get("add", 0) == before + 1


@pytest.fixture
def long_worker(live_db: None, worker_process: CeleryWorker) -> Iterator[CeleryWorker]:
    """A worker whose calls may last a minute (the shared one caps them at 30 s); the shared worker is
    stopped meanwhile, so this one takes the task, and the next test's `worker` fixture restarts it."""
    worker_process.stop()
    env = {**WORKER_ENV, "ELICIT_MAX_CALL_TIMEOUT": "60", "ELICIT_VISIBILITY_TIMEOUT": "300"}
    long = CeleryWorker(child_env(**env), name="long-worker").start()
    try:
        yield long
    finally:
        long.stop()


def test_fastmcp4_40_s_tool_runs_once_and_reports_progress(
    long_worker: CeleryWorker, fastmcp4_server: ThirdPartyServer
) -> None:
    """The issue's "35 s tool ran five times": now one send, progress stored, the result returned."""
    hub = register(fastmcp4_server.url, "fastmcp4", McpServer.Era.MODERN)
    before = fastmcp4_server.runs().get("slow_report", 0)
    call_id = hub.agent.call("slow_report", {"seconds": 40}, server="fastmcp4")

    def reported() -> bool:
        progress = hub.agent.get(f"/calls/{call_id}").json().get("progress") or {}
        return progress.get("total") == 40 and 0 < progress.get("progress", 0) < 40

    wait_until(reported, 30, 0.2, what="progress in the agent's call JSON")
    body = hub.agent.wait(call_id, 60)
    if body["status"] != "completed":
        body = hub.agent.wait(call_id, 30)
    assert body["status"] == "completed", body
    assert _text(body) == "report ready after 40 s"
    assert fastmcp4_server.runs().get("slow_report", 0) == before + 1
    assert ToolCall.objects.get(pk=call_id).attempts == 1
