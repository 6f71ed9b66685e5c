"""The per-agent rate limit on `/mcp`: the REST API's ELICIT_API_RATE, on the same counters as the API's for
the same agent, so the two paths share one budget. Real parts: a gateway process of its own (started with a
small rate), PostgreSQL, Redis, a Celery worker, the demo MCP server, the official Python SDK client."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from django.core.cache import cache
from django.test import RequestFactory
from mcp.shared.exceptions import MCPError

from approvals.models import ToolCall
from approvals.ratelimit import TokenRateThrottle
from approvals.services import servers, tokens
from tests import demo_support
from tests.hub import Agent, Hub, set_up_hub
from tests.live import child_env
from tests.test_gateway import Gateway, _client

pytestmark = pytest.mark.timeout(180)

RATE = "5/m"
LIMIT = 5


@pytest.fixture(scope="module")
def limited_gateway(django_db_setup: None) -> Iterator[Gateway]:
    gateway = Gateway(child_env(ELICIT_API_RATE=RATE))
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def _fresh_counters(agent: Any) -> None:
    """Counters live in Redis past a run, and a new test database numbers agents from 1 again: forget what an
    earlier run may have counted for this agent."""
    request = RequestFactory().get("/")
    request.auth = agent  # type: ignore[attr-defined]
    key = TokenRateThrottle(RATE).get_cache_key(request)
    window = int(time.time() // 60)
    cache.delete_many([f"{key}:{w}" for w in (window - 1, window, window + 1)])


@pytest.fixture
def hub(worker, demo_server, live_db: None) -> tuple[Hub, str]:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)
    agent = hub.server.agents.get()
    token = tokens.agent_token_rotate(agent=agent)
    hub.agent = Agent(token)
    _fresh_counters(agent)
    return hub, token


def _tools_list(url: str, token: str) -> httpx.Response:
    """One 2026-07-28 tools/list: one HTTP request, no session."""
    return httpx.post(
        url + "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/list",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        },
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/list",
        },
        timeout=30,
    )


def test_an_agent_is_limited_on_the_gateway_by_the_rest_apis_rate_and_budget(
    limited_gateway: Gateway, hub: tuple[Hub, str]
) -> None:
    rest, token = hub
    # Two requests on the REST API count against the same budget as the gateway's.
    for _ in range(2):
        assert rest.agent.get(f"/calls/{uuid.uuid4()}").status_code == 404
    allowed = [_tools_list(limited_gateway.url, token) for _ in range(LIMIT - 2)]
    assert [r.status_code for r in allowed] == [200] * (LIMIT - 2), [r.text for r in allowed]
    refused = _tools_list(limited_gateway.url, token)
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["content-type"] == "application/json"
    assert refused.json()["error"]["code"] == "rate_limited"
    assert refused.json()["error"]["message"]

    # A real client's tools/call is refused as well, and no call starts.
    async def call() -> None:
        http, client = _client(limited_gateway.url + "/mcp", token, "2026-07-28")
        async with http, client:
            await client.call_tool("demo__echo", {"text": "over the limit"})

    with pytest.raises(ExceptionGroup) as refused_call:
        anyio.run(call)
    # The SDK's error for an HTTP error status (the 429 itself is checked above, on the wire).
    assert refused_call.group_contains(MCPError, match="error response", depth=None)
    assert not ToolCall.objects.exists()

    # Another agent's budget is its own.
    _, other = tokens.agent_create(name="other-agent", servers=[rest.server])
    assert _tools_list(limited_gateway.url, other).status_code == 200
