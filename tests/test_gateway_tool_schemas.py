"""Tool definitions `/mcp` lists, as each era's clients may read them.

An upstream's tool list is passed on, but one tool the client's era does not allow must not cost the agent
every tool: the hub's own SDK server refused the whole `tools/list` result (-32603) over one tool whose
`inputSchema` is not `type: "object"` at the root (every era's rule), or whose `outputSchema` is not (the rule
through 2025-11-25; 2026-07-28 allows any JSON Schema there), and the official TypeScript SDK client refuses
it over a property that is a boolean subschema (the handshake era's schemas allow objects only). Such an input
schema leaves its tool out of the list; such an output schema is left out of the tool for a handshake-era
client (the tool is still listed and callable). On real parts: the gateway process, PostgreSQL, Redis, a
Celery worker, the demo MCP server, the official TypeScript SDK client and the official Python SDK client in
both eras.
"""

from __future__ import annotations

import json
import subprocess

import anyio
import pytest

from approvals.models import McpServer
from tests import test_gateway as gateway_tests
from tests.test_gateway import GatewayHub, _client, _ts_client

# The gateway tests' fixtures: one gateway process for this module, a fresh hub for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(300)

LIST_OF_STRINGS = {"type": "array", "items": {"type": "string"}}


@pytest.fixture
def odd_schemas(ghub: GatewayHub, demo_server) -> GatewayHub:
    odd = McpServer.objects.create(
        slug="odd", name="Odd", url=demo_server.url, default_team=ghub.hub.server.default_team
    )
    odd.tools = [
        {"name": "fine", "inputSchema": {"type": "object"}},
        {"name": "lists", "inputSchema": {"type": "object"}, "outputSchema": LIST_OF_STRINGS},
        {"name": "scalar_input", "inputSchema": {"type": "string"}},
        {"name": "no_type", "inputSchema": {"properties": {"x": {"type": "string"}}}},
        # A boolean subschema: JSON Schema allows it, the handshake era's tool schemas do not.
        {"name": "any_x", "inputSchema": {"type": "object", "properties": {"x": True}}},
    ]
    odd.save()
    odd.agents.add(ghub.hub.server.agents.get())
    return ghub


def test_the_typescript_client_lists_every_valid_tool_despite_one_the_era_refuses(
    odd_schemas: GatewayHub,
) -> None:
    done = subprocess.run(
        ["node", _ts_client(), odd_schemas.url + "/mcp", odd_schemas.token, "demo__echo", '{"text": "ts"}'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events and "tools" in events[0], done.stdout + done.stderr
    tools = events[0]["tools"]
    assert "demo__echo" in tools and "odd__fine" in tools and "odd__lists" in tools
    assert "odd__scalar_input" not in tools and "odd__no_type" not in tools and "odd__any_x" not in tools
    assert any("result" in e for e in events), events


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_an_output_schema_the_era_allows_is_kept_and_one_it_does_not_is_left_out(
    odd_schemas: GatewayHub, mode: str
) -> None:
    async def run() -> dict[str, dict]:
        http, client = _client(odd_schemas.url + "/mcp", odd_schemas.token, mode)
        async with http, client:
            listed = (await client.list_tools()).tools
            return {tool.name: tool.model_dump(by_alias=True, exclude_none=True) for tool in listed}

    tools = anyio.run(run)
    assert "odd__scalar_input" not in tools and "odd__no_type" not in tools
    assert tools["odd__fine"]["inputSchema"] == {"type": "object"}
    if mode == "legacy":
        assert "outputSchema" not in tools["odd__lists"]
        assert "odd__any_x" not in tools
    else:
        assert tools["odd__lists"]["outputSchema"] == LIST_OF_STRINGS
        assert tools["odd__any_x"]["inputSchema"] == {"type": "object", "properties": {"x": True}}
