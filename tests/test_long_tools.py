"""Long tools run once: time limits per server and per tool, "outcome unknown" instead of a blind re-send,
and progress notifications stored on the call and returned to the agent.

A real MCP server (tests/mcp_test_server.py, over Streamable HTTP with SSE answers) runs ``long_job`` (not
safe to repeat) and ``long_job_idempotent`` (annotated idempotent); both report progress while they sleep
and count how many times they started (``GET /_runs``).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from approvals.mcp_client import Completed, ServerConfig, TransientError, call_tool, run
from approvals.models import AuditEvent, McpServer, ToolCall
from approvals.services import sending
from approvals.services.servers import server_refresh_tools
from tests import factories
from tests.conftest import WORKER_ENV
from tests.hub import Hub, set_up_hub
from tests.live import free_port, wait_until
from tests.test_mcp_client import LiveServer, _start

pytestmark = pytest.mark.timeout(120)


def runs(server: LiveServer) -> dict[str, int]:
    with urllib.request.urlopen(server.base + "/_runs", timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def sse_server() -> Iterator[LiveServer]:
    proc: subprocess.Popen[bytes]
    proc, server = _start(["--sse"])
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def long_server(sse_server: LiveServer) -> LiveServer:
    sse_server.reset()
    return sse_server


# ---- the MCP client ----------------------------------------------------------------------------


def test_a_call_longer_than_each_exchange_completes_within_its_own_limit(long_server: LiveServer) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    # Each exchange may take 1 s; the call may take 10 s. It runs 2.5 s, once.
    config = long_server.config(timeout=1.0)
    outcome = run(
        call_tool(config, "long_job", {"seconds": 2.5, "steps": 5}, call_timeout=10, on_progress=on_progress)
    )
    assert isinstance(outcome, Completed), outcome
    assert outcome.result["content"][0]["text"] == "finished 5 steps in 2.5 s"
    assert runs(long_server) == {"long_job": 1}
    assert len(long_server.calls()) == 1
    # The hub sent a progressToken, and the server's notifications came back to the callback.
    token = long_server.calls()[0]["body"]["params"]["_meta"]["progressToken"]
    assert token is not None
    assert seen[0] == (0.0, 5.0, "step 1 of 5")
    assert seen[-1] == (5.0, 5.0, "done")
    assert len(seen) == 6


def test_a_call_over_its_limit_may_have_run(long_server: LiveServer) -> None:
    with pytest.raises(TransientError) as info:
        run(
            call_tool(long_server.config(timeout=5.0), "long_job", {"seconds": 3, "steps": 3}, call_timeout=1)
        )
    assert info.value.code == "timeout"
    assert info.value.may_have_run is True
    assert "may have run" in info.value.message
    assert runs(long_server) == {"long_job": 1}
    copy = pickle.loads(pickle.dumps(info.value))  # noqa: S301 - our own bytes, as Celery does
    assert copy.may_have_run is True


def test_a_failure_before_the_request_left_is_known_not_to_have_run() -> None:
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(TransientError) as info:
        run(call_tool(ServerConfig(url=closed, timeout=2.0), "long_job", {"seconds": 1}, call_timeout=30))
    assert info.value.code == "connect_failed"
    assert info.value.may_have_run is False


def test_an_error_status_after_the_request_left_may_have_run(long_server: LiveServer) -> None:
    # A 500 after the call left does not prove the tool did not run (a gateway may send it after forwarding
    # the call): only a refusal does (tests/test_call_fate.py). The stored definition: no tools/list first.
    known = {"name": "scripted", "inputSchema": {"type": "object"}}
    with pytest.raises(TransientError) as info:
        run(call_tool(long_server.config("/scripted/error500"), "scripted", {}, call_timeout=5, tool=known))
    assert info.value.code == "http_5xx"
    assert info.value.may_have_run is True


# ---- the send policy (pure rules on rows) -------------------------------------------------------


TOOLS = [
    {"name": "plain", "inputSchema": {"type": "object"}},
    {"name": "reader", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
    {"name": "again", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": True}},
    {"name": "wiper", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": False}},
    {"name": "stringy", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": "true"}},
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tool", "honours", "safe"),
    [
        ("plain", False, False),
        ("reader", False, True),
        ("again", False, True),
        ("wiper", False, False),
        ("stringy", False, False),
        ("unlisted", False, False),
        ("plain", True, True),
        ("wiper", True, True),
    ],
)
def test_safe_to_resend(tool: str, honours: bool, safe: bool) -> None:
    server = factories.server(tools=TOOLS, honours_idempotency_key=honours)
    assert sending.safe_to_resend(factories.call(server, tool=tool)) is safe


@pytest.mark.django_db
def test_call_limit_per_server_per_tool_and_capped(settings: Any) -> None:
    settings.ELICIT_MAX_CALL_TIMEOUT = 1000
    server = factories.server(call_timeout=120, tool_timeouts={"build": 900, "huge": 5000, "bad": "x"})
    assert sending.call_limit(factories.call(server, tool="deploy")) == 120
    assert sending.call_limit(factories.call(server, tool="build")) == 900
    assert sending.call_limit(factories.call(server, tool="huge")) == 1000
    assert sending.call_limit(factories.call(server, tool="bad")) == 120
    assert sending.call_limit(factories.call(factories.server("plain"), tool="x")) == 600


# ---- through the hub: a Celery worker, the API ---------------------------------------------------


@pytest.fixture
def long_hub(worker: Any, long_server: LiveServer) -> Hub:
    hub = set_up_hub(long_server.base + "/mcp", slug="long", honours_idempotency_key=False)
    server_refresh_tools(server=hub.server)  # the stored tool list carries the annotations
    return hub


def test_a_tool_longer_than_the_old_limit_runs_once_and_reports_progress(
    long_hub: Hub, long_server: LiveServer
) -> None:
    # The worker bounds each exchange by ELICIT_MCP_TIMEOUT (5 s here, as each attempt was cut at 30 s);
    # the server allows 2 s per call, but 30 s for long_job.
    McpServer.objects.filter(pk=long_hub.server.pk).update(call_timeout=2, tool_timeouts={"long_job": 30})
    seconds = float(WORKER_ENV["ELICIT_MCP_TIMEOUT"]) + 3
    call_id = long_hub.agent.call("long_job", {"seconds": seconds, "steps": 8}, server="long")

    # Progress shows while the tool runs, in the agent's call JSON.
    running = wait_until(
        lambda: (body := long_hub.agent.get(f"/calls/{call_id}").json())["progress"] and body,
        20,
        0.1,
        what="progress in the call JSON",
    )
    assert running["status"] == "running"  # type: ignore[index]
    assert running["progress"]["total"] == 8  # type: ignore[index]
    assert running["progress"]["message"].startswith("step ")  # type: ignore[index]

    body = long_hub.agent.wait(call_id, 60)
    assert body["status"] == "completed", body
    assert runs(long_server) == {"long_job": 1}
    assert len(long_server.calls()) == 1
    assert not AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").exists()
    stored = ToolCall.objects.get(pk=call_id).progress
    assert stored is not None and stored["total"] == 8 and stored["at"]


def test_a_tool_over_its_limit_ends_outcome_unknown_and_ran_once(
    long_hub: Hub, long_server: LiveServer
) -> None:
    McpServer.objects.filter(pk=long_hub.server.pk).update(call_timeout=2)
    call_id = long_hub.agent.call("long_job", {"seconds": 5, "steps": 5}, server="long")
    body = long_hub.agent.wait(call_id, 60)
    assert body["status"] == "failed", body
    assert body["error"]["code"] == "outcome_unknown"
    assert body["error"]["tool_may_have_run"] is True
    assert "may have run" in body["error"]["message"]
    # Never sent again: one tools/call, one run, no retry scheduled.
    assert len(long_server.calls()) == 1
    assert runs(long_server) == {"long_job": 1}
    assert not AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").exists()


def test_an_idempotent_tool_over_its_limit_is_sent_again(long_hub: Hub, long_server: LiveServer) -> None:
    McpServer.objects.filter(pk=long_hub.server.pk).update(call_timeout=1)
    call_id = long_hub.agent.call("long_job_idempotent", {"seconds": 4, "steps": 2}, server="long")
    body = long_hub.agent.wait(call_id, 60)
    retries = int(WORKER_ENV["ELICIT_MCP_MAX_RETRIES"])
    assert body["status"] == "failed", body
    assert body["error"]["code"] == "timeout"
    assert AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").count() == retries
    assert len(long_server.calls()) == retries + 1
    keys = {dict(c["headers"])["idempotency-key"] for c in long_server.calls()}
    assert keys == {f"elicit-{call_id}-r0"}


def test_a_connect_failure_is_retried_whatever_the_tool(worker: Any, long_server: LiveServer) -> None:
    # Nothing listens there: the request never left, so even a tool that is unsafe to repeat is retried.
    hub = set_up_hub(f"http://127.0.0.1:{free_port()}/mcp", slug="gone", honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(tools=[{"name": "long_job", "inputSchema": {}}])
    call_id = hub.agent.call("long_job", {"seconds": 1}, server="gone")
    body = hub.agent.wait(call_id, 60)
    retries = int(WORKER_ENV["ELICIT_MCP_MAX_RETRIES"])
    assert body["status"] == "failed", body
    assert body["error"]["code"] == "connect_failed"
    assert AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").count() == retries


# ---- the admin: time limits and Idempotency-Key honouring ----------------------------------------


def http_form(**extra: str) -> dict[str, str]:
    return {
        "slug": "builds",
        "name": "Build bot",
        "transport": "http",
        "url": "http://127.0.0.1:9/mcp",
        "enabled": "on",
        "on_expiry": "",
    } | extra


@pytest.mark.django_db
def test_the_admin_sets_time_limits_and_idempotency_key_honouring(admin_client: Any) -> None:
    form = http_form(call_timeout="1200", tool_timeouts='{"build": 1800}', honours_idempotency_key="on")
    page = admin_client.post("/admin/approvals/mcpserver/add/", form)
    assert page.status_code == 302, page.content.decode()[:2000]
    server = McpServer.objects.get(slug="builds")
    assert (server.call_timeout, server.tool_timeouts, server.honours_idempotency_key) == (
        1200,
        {"build": 1800},
        True,
    )
    assert sending.call_limit(factories.call(server, tool="build")) == 1800
    assert sending.safe_to_resend(factories.call(server, tool="build"))

    # Left empty: the defaults (600 s, no per-tool limits, not honoured).
    page = admin_client.post("/admin/approvals/mcpserver/add/", http_form(slug="plain"))
    assert page.status_code == 302, page.content.decode()[:2000]
    plain = McpServer.objects.get(slug="plain")
    assert (plain.call_timeout, plain.tool_timeouts, plain.honours_idempotency_key) == (600, {}, False)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"call_timeout": "0"}, "call_timeout", "from 1 to"),
        ({"call_timeout": "999999"}, "call_timeout", "ELICIT_MAX_CALL_TIMEOUT"),
        ({"tool_timeouts": "[1, 2]"}, "tool_timeouts", "an object"),
        ({"tool_timeouts": '{"build": "soon"}'}, "tool_timeouts", "'build': A time limit is a whole number"),
        ({"tool_timeouts": '{"build": 99999999}'}, "tool_timeouts", "'build': A time limit is from 1"),
        ({"tool_timeouts": '{"": 5}'}, "tool_timeouts", "A tool name is"),
    ],
)
def test_the_admin_refuses_bad_time_limits(extra: dict[str, str], field: str, message: str) -> None:
    from approvals.admin import McpServerForm

    form = McpServerForm(data=http_form(**extra))
    assert not form.is_valid()
    assert message in " ".join(form.errors[field])


# ---- progress: throttled, the last one always stored ---------------------------------------------


def test_a_burst_of_progress_is_stored_twice_ending_with_the_last(live_db: None, monkeypatch: Any) -> None:
    import anyio

    server = factories.server()
    call = factories.call(server, status=ToolCall.Status.RUNNING)
    writes: list[dict[str, Any]] = []
    store = sending.call_progress

    def counted(*, call_id: Any, progress: dict[str, Any]) -> bool:
        writes.append(progress)
        return store(call_id=call_id, progress=progress)

    monkeypatch.setattr(sending, "call_progress", counted)
    writer = sending.ProgressWriter(call.pk)

    async def burst() -> None:
        # As the SDK delivers them: each notification in a task of its own, all before the first write ends.
        async with anyio.create_task_group() as tg:
            for step in range(50):
                tg.start_soon(writer, float(step), 50.0, f"step {step}" + "x" * 600 * (step == 49))
            tg.start_soon(writer, float("nan"), None, "not a number: ignored")

    anyio.run(burst)
    assert [w["progress"] for w in writes] == [0.0, 49.0]
    call.refresh_from_db()
    assert call.progress is not None
    assert call.progress["progress"] == 49.0 and call.progress["total"] == 50.0
    assert len(call.progress["message"]) == sending.MAX_PROGRESS_MESSAGE
