"""What `/mcp` forwards, on real parts: the gateway process, PostgreSQL, Redis, a Celery worker, the demo MCP
server, an upstream on the official SDK (tests/gateway_upstream_server.py: a tool with an output schema) and
the official Python SDK client in both eras.

- a result over ELICIT_MAX_RESULT of a tool with an output schema is a clean tool error, as the REST API shows
  it, not a result a client with that schema refuses;
- the upstream's `io.modelcontextprotocol/serverInfo` stamp never passes as the hub's;
- tool names that collide on `/mcp` (legacy slugs holding `__`) are left out, never one of them silently;
- while a call waits, its progress notifications name its id, which the REST API takes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import mcp_types as types
import pytest
from django.conf import settings
from mcp.shared.exceptions import MCPError

from approvals.models import McpServer, ToolCall
from approvals.services import servers
from tests import test_gateway as gateway_tests
from tests.gateway_upstream_server import NAME as UPSTREAM_NAME
from tests.live import ROOT, free_port, wait_until
from tests.test_gateway import MODES, Gateway, GatewayHub, _client, _pending_call, _text, call_in_background

# The gateway tests' fixtures: one gateway process for this module, a fresh hub for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def upstream_url(django_db_setup: None) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "gateway_upstream_server.py"), str(port)])

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError("the upstream test server exited")
        try:  # listening (a GET of /mcp would open an endless event stream)
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    try:
        wait_until(up, 30, 0.1, what="the upstream test server")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def typed(ghub: GatewayHub, upstream_url: str) -> GatewayHub:
    """The upstream (slug "typed", its tool list stored) added to the servers the gateway's agent may use."""
    server = McpServer.objects.create(
        slug="typed", name="Typed", url=upstream_url, default_team=ghub.hub.server.default_team
    )
    servers.server_refresh_tools(server=server)
    assert server.tools and server.tools[0].get("outputSchema"), server.tools
    server.agents.add(ghub.hub.server.agents.get())
    return ghub


async def _list_and_call(url: str, token: str, mode: str, name: str, arguments: dict[str, Any]) -> Any:
    """What the agent's client makes of the call, after a tools/list (the SDK learns the output schema)."""
    http, client = _client(url, token, mode)
    async with http, client:
        await client.list_tools()
        return await client.call_tool(name, arguments)


# --- a result over the hub's size limit -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_an_oversized_result_of_a_tool_with_an_output_schema_is_a_clean_tool_error(
    typed: GatewayHub, mode: str
) -> None:
    small = anyio.run(_list_and_call, typed.url + "/mcp", typed.token, mode, "typed__report", {"size": 10})
    assert small.is_error is False and small.structured_content == {"size": 10, "body": "r" * 10}

    size = settings.ELICIT_MAX_RESULT + 1000  # the worker's limit: the default (1 MiB)
    result = anyio.run(_list_and_call, typed.url + "/mcp", typed.token, mode, "typed__report", {"size": size})
    assert isinstance(result, types.CallToolResult)
    assert result.is_error is True
    text = _text(result)
    assert "too large for the hub" in text
    assert str(settings.ELICIT_MAX_RESULT) in text
    call_id = result.meta["elicit-hub/call"]["id"]  # type: ignore[index]
    assert result.meta["elicit-hub/call"]["result_truncated"] is True  # type: ignore[index]
    # The REST API shows the same result, and the size the server sent.
    shown = typed.hub.agent.get(f"/calls/{call_id}").json()
    assert shown["status"] == "completed" and shown["result_truncated"] is True
    assert shown["result_size"] > size and f"{shown['result_size']} bytes" in text
    assert shown["result"]["isError"] is True
    assert (
        shown["result"]["content"]
        == result.model_dump(mode="json", by_alias=True, exclude_none=True)["content"]
    )
    assert "structuredContent" not in shown["result"]


# --- the upstream's identity ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_upstreams_server_info_stamp_is_not_passed_as_the_hubs(typed: GatewayHub, mode: str) -> None:
    result = anyio.run(_list_and_call, typed.url + "/mcp/typed", typed.token, mode, "report", {"size": 10})
    assert result.is_error is False
    # The upstream stamped its own identity on the result the hub stored.
    meta = result.meta or {}
    stored = ToolCall.objects.get(pk=meta["elicit-hub/call"]["id"]).result
    assert stored is not None and stored["_meta"][types.SERVER_INFO_META_KEY]["name"] == UPSTREAM_NAME
    if mode == "2026-07-28":  # the SDK stamps the hub's own
        assert meta[types.SERVER_INFO_META_KEY]["name"] == "elicit-hub"
    else:  # a handshake-era result carries no stamp
        assert types.SERVER_INFO_META_KEY not in meta


# --- colliding tool names -------------------------------------------------------------------------------


def test_colliding_tool_names_are_left_out_and_logged_never_one_silently(
    ghub: GatewayHub, gateway: Gateway, demo_server
) -> None:
    """`a` with tool `b__c` and `a__b` with tool `c` both make `a__b__c`: neither is listed or callable (which
    server would it call?), their other tools are, and the gateway's log names the collision. Slugs holding
    `__` are refused now; servers registered before keep theirs."""
    team = ghub.hub.server.default_team
    agent = ghub.hub.server.agents.get()
    for slug, tools in [("a", ["b__c", "only_a"]), ("a__b", ["c", "only_ab"])]:
        server = McpServer.objects.create(slug=slug, name=slug, url=demo_server.url, default_team=team)
        server.tools = [{"name": name, "inputSchema": {"type": "object"}} for name in tools]
        server.save()
        server.agents.add(agent)
    logged = len(gateway.log())

    names = gateway_tests.list_tools(ghub.url + "/mcp", ghub.token, "2026-07-28")
    assert "a__b__c" not in names
    assert {"a__only_a", "a__b__only_ab", "demo__echo"} <= set(names)
    wait_until(lambda: "a__b__c" in gateway.log()[logged:], 10, 0.1, what="the collision in the log")
    assert "a__b" in gateway.log()[logged:]

    async def call() -> None:
        http, client = _client(ghub.url + "/mcp", ghub.token, "2026-07-28")
        async with http, client:
            await client.call_tool("a__b__c", {})

    with pytest.raises(ExceptionGroup) as refused:
        anyio.run(call)
    assert refused.group_contains(MCPError, match="Unknown tool", depth=None)
    assert not ToolCall.objects.exists()
    # Under its own slug, each server's tool keeps its upstream name.
    assert "b__c" in gateway_tests.list_tools(ghub.url + "/mcp/a", ghub.token, "2026-07-28")
    assert "c" in gateway_tests.list_tools(ghub.url + "/mcp/a__b", ghub.token, "2026-07-28")


# --- the call's id while it waits ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_progress_names_the_call_so_the_agent_can_use_the_rest_api_while_it_waits(
    ghub: GatewayHub, mode: str
) -> None:
    outcome, thread = call_in_background(
        ghub.url + "/mcp", ghub.token, mode, "demo__create_deployment", {"branch": "feature/id"}
    )
    call_id = _pending_call(ghub.hub)
    # Every notification names the call, the first (sent as the call is queued) too, beside what it waits for.
    wait_until(
        lambda: any("waiting for release: 0 of 1 approval" in (m or "") for _, m in outcome.progress),
        30,
        0.1,
        what="a progress notification naming the team",
    )
    assert outcome.progress and all(f"(call {call_id})" in (m or "") for _, m in outcome.progress)
    # With that id the agent reads the call, and gives up on it, over the REST API.
    assert ghub.hub.agent.get(f"/calls/{call_id}").json()["status"] == "awaiting_input"
    assert ghub.hub.agent.post(f"/calls/{call_id}/cancel", {}).status_code == 200
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert outcome.result is not None and outcome.result.is_error is True
    assert "cancelled" in _text(outcome.result)
