"""A 2026-07-28 retry (`requestState` and `inputResponses`) answers a call the hub already sent: it is found
by the call the hub's own sealed state names, not by the tool lists of now. An upstream that drops or
renames the tool while its question waits (a refresh of its stored list) no longer leaves the agent's
answers refused as an unknown tool, the question unanswerable and the call waiting for its deadline; an
agent that lost the server still cannot answer through it. Real parts: the gateway process, PostgreSQL,
Redis, a Celery worker, the demo MCP server and the official Python SDK client."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from approvals.models import InputRequest, McpServer, ToolCall
from tests import demo_support
from tests import test_gateway as gateway_tests
from tests.live import wait_until
from tests.test_gateway import GatewayHub, _text
from tests.test_gateway_passthrough import _connect, _never, _requester_rule

gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)

TOOL = "create_deployment"
ANSWER: dict[str, types.InputResponse] = {
    "environment": types.ElicitResult(action="accept", content={"environment": "staging"})
}


def _drop_tool() -> None:
    """What a refresh stores when the upstream no longer lists the tool."""
    server = McpServer.objects.get(slug="demo")
    server.tools = [tool for tool in server.tools or [] if tool["name"] != TOOL]
    server.save()


async def _ask(url: str, token: str, arguments: dict[str, Any]) -> types.InputRequiredResult:
    http, client = _connect(url, token, "2026-07-28", _never)
    async with http, client:
        first = await client.session.call_tool(url_name(url), arguments, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult), first
        return first


def url_name(url: str) -> str:
    return TOOL if url.endswith("/mcp/demo") else f"demo__{TOOL}"


async def _retry(url: str, token: str, arguments: dict[str, Any], state: str | None) -> Any:
    http, client = _connect(url, token, "2026-07-28", _never)
    async with http, client:
        try:
            return await client.session.call_tool(
                url_name(url),
                arguments,
                input_responses=ANSWER,
                request_state=state,
                allow_input_required=True,
            )
        except MCPError as exc:
            return exc


@pytest.mark.parametrize("path", ["/mcp", "/mcp/demo"])
def test_a_retry_reaches_its_call_after_the_server_dropped_the_tool(
    ghub: GatewayHub, demo_server, path: str
) -> None:
    _requester_rule(ghub)
    url = ghub.url + path
    arguments = {"branch": "gone"}
    first = anyio.run(_ask, url, ghub.token, arguments)
    _drop_tool()

    done = anyio.run(_retry, url, ghub.token, arguments, first.request_state)

    assert isinstance(done, types.CallToolResult), done
    assert done.is_error is False and "Deployed gone to staging" in _text(done)
    call = ToolCall.objects.get()
    assert call.status == "completed"
    assert demo_support.executions(demo_server.url).get(TOOL) == 1
    # A new call of the dropped tool is still an unknown tool.
    fresh = anyio.run(_retry, url, ghub.token, {"branch": "new"}, None)
    assert isinstance(fresh, MCPError) and fresh.error.code == types.INVALID_PARAMS
    assert "Unknown tool" in fresh.error.message
    assert ToolCall.objects.count() == 1


def test_an_agent_that_lost_the_server_cannot_answer_through_it(ghub: GatewayHub) -> None:
    _requester_rule(ghub)
    url = ghub.url + "/mcp"
    arguments = {"branch": "taken"}
    first = anyio.run(_ask, url, ghub.token, arguments)
    server = McpServer.objects.get(slug="demo")
    server.agents.clear()

    refused = anyio.run(_retry, url, ghub.token, arguments, first.request_state)

    assert isinstance(refused, MCPError), refused
    assert refused.error.code == types.INVALID_PARAMS
    assert InputRequest.objects.get().status == InputRequest.Status.PENDING
    wait_until(lambda: ToolCall.objects.get().status == "awaiting_input", 10, what="the call still waiting")
