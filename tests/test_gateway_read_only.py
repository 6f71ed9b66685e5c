"""A gateway whose PostgreSQL takes no writes (a standby reached after a failover) still opens an agent's
session and lists its tools: recording the token's use is best effort. A tool call, which stores the call,
is still refused, and nothing is stored."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from mcp import types

from approvals.models import ToolCall
from approvals.services import servers, tokens
from tests import demo_support, live
from tests.hub import set_up_hub
from tests.live import child_env
from tests.test_gateway import Gateway
from tests.test_outage_gateway_redis import CALL, INITIALIZE, VERSION

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def read_only_gateway(live_db: None) -> Iterator[Gateway]:
    """The gateway process on a connection whose transactions are read-only (the suite's database)."""
    url = live.read_only_database_url()
    process = Gateway(child_env(DATABASE_URL=url))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _answer(response: httpx.Response) -> dict:
    """The JSON-RPC answer of a POST, answered as JSON or as one server-sent event."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return json.loads(response.content)
    data = [line[len("data:") :] for line in response.text.splitlines() if line.startswith("data:")]
    assert len(data) == 1, response.text
    return json.loads(data[0])


def test_a_read_only_database_opens_a_session_and_lists_tools_but_refuses_a_call(
    demo_server: demo_support.DemoServer,
    read_only_gateway: Gateway,
) -> None:
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)
    token = tokens.agent_token_rotate(agent=hub.server.agents.get())
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=read_only_gateway.url, headers=headers, timeout=30) as agent:
        assert agent.post("/mcp/demo", json=INITIALIZE).status_code == 200
        opened = agent.post("/mcp", json=INITIALIZE)
        assert opened.status_code == 200, opened.text
        session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert agent.post("/mcp", json=initialized, headers=session).status_code == 202
        listed = agent.post("/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers=session)
        assert listed.status_code == 200, listed.text
        assert "demo__echo" in listed.text

        called = agent.post("/mcp", json=CALL, headers=session)
        assert "result" not in _answer(called), called.text
        assert _answer(called)["error"]["code"] == types.INTERNAL_ERROR
        # Said as the REST API's 503 says it: nothing was stored (not "a call it started goes on").
        assert "nothing was stored" in _answer(called)["error"]["message"], called.text
    assert not ToolCall.objects.exists()
