"""Acceptance of gates: a destructive call stopped before it is sent, a reviewer edits one argument and
approves in the browser, the server receives the edited arguments once, the agent gets the result on the
same request. The agent is the official TypeScript SDK client through `/mcp`, or a REST agent.

Real parts throughout: Chromium (Playwright), Daphne, the gateway process, a Celery worker, the demo MCP
server (which records every request it receives), PostgreSQL and Redis."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from approvals.models import AuditEvent, McpServer, RoutingRule, Team, ToolCall
from approvals.services import servers, tokens
from tests import demo_support
from tests.browser.conftest import confirm_second_look
from tests.hub import Hub, set_up_hub
from tests.live import child_env, wait_until
from tests.test_gateway import Gateway, _node, _ts_client

pytestmark = [pytest.mark.timeout(240), pytest.mark.django_db(transaction=True)]

TOOL = "create_deployment"
ASKED = {"branch": "ts", "environment": "production"}
EDITED = {"branch": "ts", "environment": "staging"}


@pytest.fixture(scope="module")
def gateway_for_gates(django_db_setup: None) -> Iterator[Gateway]:
    gateway = Gateway(child_env(ELICIT_GATEWAY_PROGRESS_INTERVAL="1"))
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def gated_hub(worker: Any, web: Any, demo_server: Any) -> Hub:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    # In a thread of its own: the MCP client runs an event loop, and Playwright's is running in this one.
    lister = threading.Thread(target=_refresh_tools, args=(hub.server.pk,))
    lister.start()
    lister.join(30)
    assert McpServer.objects.get(pk=hub.server.pk).tool(TOOL) is not None
    RoutingRule.objects.create(
        position=1,
        name="destructive tools need approval",
        destructive=True,
        gate=True,
        team=Team.objects.get(slug="release"),
    )
    return hub


def _refresh_tools(server_id: int) -> None:
    from django.db import connection

    try:
        servers.server_refresh_tools(server=McpServer.objects.get(pk=server_id))
    finally:
        connection.close()


def sent(url: str) -> list[dict[str, Any]]:
    return [
        r["body"]["params"]["arguments"]
        for r in demo_support.recorded_requests(url)
        if isinstance(r.get("body"), dict)
        and r["body"].get("method") == "tools/call"
        and r["body"]["params"].get("name") == TOOL
    ]


def gated_call() -> ToolCall:
    def found() -> ToolCall | None:
        return ToolCall.objects.filter(tool=TOOL, status=ToolCall.Status.AWAITING_INPUT).first()

    call = wait_until(found, 30, 0.1, what="the gated call")
    assert isinstance(call, ToolCall)
    return call


def edit_to_staging(edit: Any) -> None:
    """In the open edit form: the arguments become EDITED, in the JSON editor or the schema's form."""
    editor = edit.locator("#arguments-json")
    if editor.count():
        editor.fill(json.dumps(EDITED, indent=2))
    else:
        edit.get_by_label("Environment").fill("staging")


def edit_and_approve_in_the_browser(
    new_page: Any, hub: Hub, call: ToolCall, *, by_keyboard: bool = False
) -> None:
    item = hub.reviewer.wait_for_request(str(call.pk), "gate")
    page = new_page("alice")
    page.goto(f"/requests/{item['id']}/")
    # What the reviewer sees before deciding: who asks, the tool as the server claims it, the digest.
    assert "ci-agent" in page.locator("[data-who]").inner_text()
    assert page.locator("[data-tool-description]").inner_text().startswith("Deploy a branch")
    assert "may make destructive changes" in page.locator("[data-tool-claims]").inner_text()
    assert page.locator("[data-digest]").inner_text() == item["gate"]["digest"]
    page.get_by_text("Edit the arguments…").click()
    edit_to_staging(page.locator("#gate-edit-form"))
    if by_keyboard:
        # Ctrl+Enter while editing sends the edit: never the approval of the arguments as asked.
        page.locator("#gate-edit-form :is(textarea, input:not([type=hidden]))").first.press("Control+Enter")
    else:
        page.get_by_role("button", name="Approve and send these arguments").click()
    # The tool is destructive, as the server says: the edit is shown once more, then confirmed.
    shown = confirm_second_look(page, by_keyboard=by_keyboard)
    assert '"environment": "staging"' in shown
    page.locator(".messages").wait_for()  # the queue, with its confirmation
    assert "Approved" in page.content()


def test_a_typescript_client_waits_while_a_reviewer_edits_and_approves_in_the_browser(
    gated_hub: Hub, demo_server: Any, gateway_for_gates: Gateway, new_page: Any
) -> None:
    token = tokens.agent_token_rotate(agent=gated_hub.server.agents.get())
    proc = subprocess.Popen(
        [_node(), _ts_client(), gateway_for_gates.url + "/mcp", token, f"demo__{TOOL}", json.dumps(ASKED)],
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

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        call = gated_call()
        wait_until(
            lambda: any("approval to send" in (e.get("progress") or {}).get("message", "") for e in events),
            30,
            0.1,
            what="the client hearing what it waits for",
        )
        assert sent(demo_server.url) == []  # stopped before anything reached the server
        edit_and_approve_in_the_browser(new_page, gated_hub, call)
        proc.wait(90)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    results = [e["result"] for e in events if "result" in e]
    assert results, events
    result = results[0]
    assert result.get("isError") is not True, result
    assert "Deployed ts to staging" in "\n".join(c.get("text", "") for c in result["content"])
    about = result["_meta"]["elicit-hub/call"]
    assert about["id"] == str(call.pk)
    assert about["gate"]["diff"] == [
        {"path": "environment", "op": "changed", "from": "production", "to": "staging"}
    ]
    assert sent(demo_server.url) == [EDITED]  # the edited arguments, once
    assert demo_support.executions(demo_server.url) == {TOOL: 1}
    verbs = list(
        AuditEvent.objects.filter(call_id=call.pk, verb__startswith="gate.").values_list("verb", flat=True)
    )
    assert verbs == ["gate.opened", "gate.edited", "gate.approved", "gate.used"]


class RestAgent:
    """An agent on the REST API of the running web process (Daphne), over real HTTP."""

    def __init__(self, web: Any, hub: Hub) -> None:
        token = tokens.agent_token_rotate(agent=hub.server.agents.get())
        self.http = httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {token}"}, timeout=90)

    def call(self, tool: str, arguments: dict[str, Any]) -> str:
        response = self.http.post(
            "/api/v1/calls", json={"server": "demo", "tool": tool, "arguments": arguments}
        )
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def wait(self, call_id: str, seconds: int = 60) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/calls/{call_id}", params={"wait": seconds})
        assert response.status_code == 200, response.text
        return dict(response.json())


def call_at_its_gate(gated_hub: Hub, web: Any, new_page: Any, arguments: dict) -> tuple[RestAgent, str, Any]:
    """An agent's call of TOOL stopped at its gate, and alice's browser on the gate's page."""
    agent = RestAgent(web, gated_hub)
    call_id = agent.call(TOOL, arguments)
    item = gated_hub.reviewer.wait_for_request(call_id, "gate")
    page = new_page("alice")
    page.goto(f"/requests/{item['id']}/")
    return agent, call_id, page


def test_a_rest_agent_gets_the_edited_call_s_result(
    gated_hub: Hub, demo_server: Any, web: Any, new_page: Any
) -> None:
    agent = RestAgent(web, gated_hub)
    call_id = agent.call(TOOL, ASKED)
    call = ToolCall.objects.get(pk=call_id)
    edit_and_approve_in_the_browser(new_page, gated_hub, call, by_keyboard=True)
    done = agent.wait(call_id)
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"]["environment"] == "staging"
    assert done["gate"]["diff"][0]["to"] == "staging"
    assert sent(demo_server.url) == [EDITED]
    page = new_page("alice")
    page.goto(f"/calls/{call_id}/")
    diff = page.locator("[data-gate-diff]")
    assert "environment" in diff.inner_text() and "staging" in diff.inner_text()


def test_the_agent_reads_a_decline_made_in_the_browser(
    gated_hub: Hub, demo_server: Any, web: Any, new_page: Any
) -> None:
    agent, call_id, page = call_at_its_gate(gated_hub, web, new_page, ASKED)
    page.locator("[data-decline-toggle]").click()
    page.locator("#decline-reason").fill("production is frozen")
    # Ctrl+Enter in the reason sends the decline being written, never the page's approval.
    page.locator("#decline-reason").press("Control+Enter")
    page.wait_for_url("**/")
    done = agent.wait(call_id, 30)
    assert done["status"] == "failed"
    assert done["error"]["message"] == "alice declined this call: production is frozen. It was not sent."
    assert sent(demo_server.url) == []
