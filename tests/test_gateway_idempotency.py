"""An `Idempotency-Key` on `/mcp`, on real parts: the gateway process, PostgreSQL, Redis, a Celery worker, the
demo MCP server and the official Python SDK client in both eras.

An MCP client's headers are the same on every request of its connection, so a key set once reaches every
tools/call. The key repeats its own call only: another tool, or other arguments, under a key already used
is refused (JSON-RPC -32602, saying so), never answered with the result of the call the key first made.
"""

from __future__ import annotations

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from approvals.models import ToolCall
from tests import demo_support
from tests import test_gateway as gateway_tests
from tests.test_gateway import MODES, GatewayHub, _client, _text

# The gateway tests' fixtures: one gateway process for this module, a fresh hub for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("mode", MODES)
def test_a_key_used_for_one_call_is_refused_for_another_and_repeats_its_own(
    ghub: GatewayHub, demo_server, mode: str
) -> None:
    async def run() -> tuple[types.CallToolResult, list[MCPError], types.CallToolResult]:
        http, client = _client(ghub.url + "/mcp", ghub.token, mode, key="one-key")
        async with http, client:
            await client.list_tools()
            first = await client.call_tool("demo__echo", {"text": "first"})
            refused = []
            for name, arguments in [
                ("demo__echo", {"text": "second"}),  # other arguments
                ("demo__create_deployment", {"branch": "main"}),  # another tool
            ]:
                with pytest.raises(MCPError) as error:
                    await client.call_tool(name, arguments)
                refused.append(error.value)
            again = await client.call_tool("demo__echo", {"text": "first"})
            return first, refused, again

    first, refused, again = anyio.run(run)
    assert first.is_error is False and "first" in _text(first)
    for error in refused:
        assert error.error.code == types.INVALID_PARAMS
        assert "Idempotency-Key" in error.error.message and "echo" in error.error.message
    # The key still repeats its own call: the same result, one execution.
    assert _text(again) == _text(first)
    assert again.meta and first.meta and again.meta["elicit-hub/call"] == first.meta["elicit-hub/call"]
    assert ToolCall.objects.count() == 1
    assert demo_support.executions(demo_server.url).get("echo") == 1
    assert demo_support.executions(demo_server.url).get("create_deployment", 0) == 0
