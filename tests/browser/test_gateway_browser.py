"""Issue 13's acceptance through `/mcp`, with the reviewer in a real browser: an official SDK client
(TypeScript, and Python in handshake-era mode) calls a tool whose upstream asks for input, a reviewer
answers on the request page, and the client gets the upstream's result on the same request, with progress
while it waited.
Real parts: the gateway process, Daphne, a Celery worker, the demo MCP server, PostgreSQL and Redis."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from approvals.models import AuditEvent, ToolCall
from approvals.services import servers, tokens
from tests import demo_support
from tests import test_gateway as gateway_tests
from tests.browser.conftest import confirm_second_look, wait_live
from tests.browser.test_dashboard import QUEUE_URL, pending_request
from tests.hub import Hub, off_the_loop
from tests.live import wait_until
from tests.test_gateway import _node, _text, _ts_client, call_in_background

gateway_process = gateway_tests.gateway_process  # the gateway tests' fixture: one process for this module

pytestmark = pytest.mark.timeout(180)


@dataclass
class Gw:
    hub: Hub
    token: str
    url: str


@pytest.fixture
def gw(hub: Hub, gateway_process: Any) -> Gw:
    # The stored tool list, from the real demo server; on a thread of its own, as Playwright's loop runs here.
    off_the_loop(servers.server_refresh_tools, server=hub.server)
    token = tokens.agent_token_rotate(agent=hub.server.agents.get())
    return Gw(hub, token, gateway_process.url)


def approve_staging_in_the_browser(new_page: Any, call_id: str) -> None:
    ir = pending_request(call_id, "environment")
    page = new_page("alice")
    page.goto(f"/requests/{ir.pk}/")
    wait_live(page)
    page.get_by_label("Staging").check()
    page.get_by_role("button", name=re.compile("Approve and send")).click()
    assert confirm_second_look(page)  # create_deployment is destructive, as the demo server says
    page.wait_for_url(QUEUE_URL)


def gateway_call(timeout: float = 30) -> str:
    found = wait_until(
        lambda: ToolCall.objects.filter(tool="create_deployment").values_list("pk", flat=True).first(),
        timeout,
        0.1,
        what="the gateway's call",
    )
    return str(found)


@pytest.fixture
def ts_events(gw: Gw) -> Iterator[tuple[list[dict[str, Any]], subprocess.Popen[str]]]:
    script = _ts_client()
    proc = subprocess.Popen(
        [
            _node(),
            script,
            gw.url + "/mcp",
            gw.token,
            "demo__create_deployment",
            json.dumps({"branch": "ts-ui"}),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    events: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                events.append(json.loads(line))
            except ValueError:
                events.append({"output": line})

    threading.Thread(target=read, daemon=True).start()
    try:
        yield events, proc
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_typescript_client_gets_the_result_after_a_reviewer_answers_in_the_browser(
    gw: Gw, new_page: Any, demo_server: Any, ts_events: tuple[list[dict[str, Any]], subprocess.Popen[str]]
) -> None:
    events, proc = ts_events
    call_id = gateway_call()
    wait_until(
        lambda: any("waiting for release" in (e.get("progress") or {}).get("message", "") for e in events),
        30,
        0.1,
        what="progress in the TypeScript client",
    )
    assert proc.poll() is None  # the request is still open
    approve_staging_in_the_browser(new_page, call_id)
    proc.wait(60)
    wait_until(lambda: any("result" in e for e in events), 10, 0.1, what="the result line")
    results = [e["result"] for e in events if "result" in e]
    assert len(results) == 1, events
    assert results[0].get("isError") is not True
    assert "Deployed ts-ui to staging" in "\n".join(c.get("text", "") for c in results[0]["content"])
    assert results[0]["_meta"]["elicit-hub/call"] == {"id": call_id, "status": "completed"}
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    answered = AuditEvent.objects.get(call_id=call_id, verb="input.answered")
    assert answered.actor_label == "alice" and answered.data["content"] == {"environment": "staging"}


def test_the_python_client_in_handshake_mode_gets_the_result_after_a_browser_answer(
    gw: Gw, new_page: Any, demo_server: Any
) -> None:
    outcome, thread = call_in_background(
        gw.url + "/mcp", gw.token, "legacy", "demo__create_deployment", {"branch": "py-ui"}
    )
    call_id = gateway_call()
    wait_until(
        lambda: any("waiting for release" in (m or "") for _, m in outcome.progress),
        30,
        0.1,
        what="progress in the Python client",
    )
    assert thread.is_alive()
    approve_staging_in_the_browser(new_page, call_id)
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert outcome.result is not None and outcome.result.is_error is False
    assert "Deployed py-ui to staging" in _text(outcome.result)
    assert outcome.result.meta and outcome.result.meta["elicit-hub/call"]["id"] == call_id
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
