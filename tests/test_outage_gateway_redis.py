"""While Redis is down the MCP gateway refuses a request with the REST API's 503 (`engine_unavailable`, with
Retry-After) before anything is stored, as the REST API refuses a write: a `tools/call` accepted then would be
stored with its send never queued (the broker is Redis) and the agent left waiting on it. Once Redis is back
the gateway serves again.

The gateway process runs on a Redis of the test's own, which the test stops (never the suite's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from approvals import outage
from approvals.models import ToolCall
from approvals.services import servers, tokens
from tests import demo_support
from tests.hub import set_up_hub
from tests.live import child_env, wait_until
from tests.test_gateway import Gateway
from tests.test_outage_broker import StoppableRedis

pytestmark = pytest.mark.timeout(180)

VERSION = "2025-11-25"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": VERSION,
        "capabilities": {},
        "clientInfo": {"name": "outage", "version": "1"},
    },
}
CALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "demo__echo", "arguments": {"text": "sent while Redis is down"}},
}


@pytest.fixture
def own_redis() -> Iterator[StoppableRedis]:
    server = StoppableRedis().start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def gateway(live_db: None, own_redis: StoppableRedis) -> Iterator[Gateway]:
    process = Gateway(child_env(REDIS_URL=own_redis.url, ELICIT_REDIS_TIMEOUT="1"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _is_503(response: httpx.Response) -> bool:
    if response.status_code != 503 or response.headers.get("retry-after") != str(outage.RETRY_AFTER):
        return False
    error = json.loads(response.content)["error"]
    return error["code"] == "engine_unavailable" and "queue" in error["message"]


def test_with_redis_down_the_gateway_answers_503_and_stores_no_call(
    demo_server: demo_support.DemoServer,
    own_redis: StoppableRedis,
    gateway: Gateway,
) -> None:
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)
    token = tokens.agent_token_rotate(agent=hub.server.agents.get())
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as agent:
        opened = agent.post("/mcp", json=INITIALIZE)
        assert opened.status_code == 200, opened.text
        session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert agent.post("/mcp", json=initialized, headers=session).status_code == 202

        own_redis.stop()
        # A call on the open session: refused before it is stored, not stored and then failed or left waiting.
        called = agent.post("/mcp", json=CALL, headers=session)
        assert _is_503(called), (called.status_code, called.text)
        assert not ToolCall.objects.exists()
        # A new session is refused the same way, on either path.
        for path in ("/mcp", "/mcp/demo"):
            refused = agent.post(path, json=INITIALIZE)
            assert _is_503(refused), (path, refused.status_code, refused.text)
        # Without a token it is still a 401, as the REST API's reads are while Redis is down.
        anonymous = httpx.post(gateway.url + "/mcp", json=INITIALIZE, headers={"Accept": headers["Accept"]})
        assert anonymous.status_code == 401, anonymous.text

        own_redis.start()
        wait_until(
            lambda: agent.post("/mcp", json=INITIALIZE).status_code == 200, 30, 0.3, what="the gateway back"
        )
