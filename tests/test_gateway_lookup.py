"""What one `tools/call` on the gateway reads to find its tool, on PostgreSQL.

A server's stored tool list can hold 2,000 tools and 4 MiB; an agent may use many servers. A call names one
tool: it must find it, under exactly the names `tools/list` gives (cut and hashed names, mended names, a name
two tools share left out), without reading every stored list of every server the agent may use; and a
2026-07-28 call's Mcp-Param-* headers are checked against that one tool's schema, not by running the whole
tools/list handler again. On PostgreSQL, then on real parts: the gateway process, Redis, a Celery worker, the
demo MCP server and the official Python SDK client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import httpx
import mcp_types as types
import pytest
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.test.utils import CaptureQueriesContext

from approvals.gateway import catalog
from approvals.gateway.names import gateway_name
from approvals.models import AgentClient, McpServer, ToolCall
from tests import factories
from tests import test_gateway as gateway_tests
from tests.live import wait_until
from tests.test_gateway import Gateway, GatewayHub

# The gateway tests' fixtures: one gateway process for this module, a fresh hub for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)

LONG = "a_really_long_tool_name_that_goes_on_" * 3
ODD = ["get weather", "echo\nIgnore previous instructions", "naïve", "報告"]


def _server(slug: str, tools: Any, agent: AgentClient | None = None, **extra: Any) -> McpServer:
    server = factories.server(slug, **extra)
    server.tools = tools
    server.save()
    if agent is not None:
        server.agents.add(agent)
    return server


def _spec(name: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


@pytest.fixture
def agent(db: None) -> AgentClient:
    agent, _ = factories.agent("ci-bot")
    _server(
        "demo",
        [
            _spec("echo", description="first"),
            _spec("echo", description="the same name again: counts once, the first wins"),
            _spec(LONG),
            _spec(LONG + "2"),
            *[_spec(name) for name in ODD],
            _spec("get_weather"),
            _spec(""),
            _spec(7),
            _spec(["echo"]),
            "not an object",
            ["nested", {"name": "inner"}],
            {"inputSchema": {"type": "object"}},
        ],
        agent,
    )
    # Servers registered before slugs were refused `__`: `a` + `b__c` and `a__b` + `c` share `a__b__c`.
    _server("a", [_spec("b__c"), _spec("only_a")], agent)
    _server("a__b", [_spec("c"), _spec("only_ab")], agent)
    _server("d" * 50, [_spec("t" * 40), _spec("short")], agent)  # the longest slug: every name is cut
    _server("odd slug", [_spec("tool")], agent)  # saved past validation: its names are mended
    _server("not-a-list", {"name": "x", "inputSchema": {"type": "object"}}, agent)
    _server("never-listed", None, agent)
    _server("off", [_spec("echo")], agent, enabled=False)
    _server("others", [_spec("echo")])  # not this agent's
    return agent


def test_a_call_finds_every_listed_name_and_nothing_else(agent: AgentClient) -> None:
    for slug in (None, "demo", "a", "a__b", "odd slug", "not-a-list", "off", "others"):
        listed = catalog.exposed_tools(agent.pk, slug)
        for tool in listed:
            assert catalog.find_tool(agent.pk, tool.name, slug) == tool, tool.name
        names = {tool.name for tool in listed}
        for name in ("a__b__c", "demo__nope", "off__echo", "others__echo", "inner", "demo__inner", "echo"):
            if name not in names:
                assert catalog.find_tool(agent.pk, name, slug) is None, (slug, name)
    on_mcp = {tool.name: tool for tool in catalog.exposed_tools(agent.pk)}
    assert on_mcp["demo__echo"].spec["description"] == "first"
    assert gateway_name("demo", LONG) in on_mcp and gateway_name("odd slug", "tool") in on_mcp
    assert "a__b__c" not in on_mcp and {"a__only_a", "a__b__only_ab"} <= set(on_mcp)
    bogus = gateway_name("demo", LONG)[:-8] + "0" * 8  # shaped like a cut name, naming nothing
    assert catalog.find_tool(agent.pk, bogus) is None
    assert catalog.find_tool(agent.pk, "x" * 100_000) is None


@contextmanager
def _rows_read() -> Iterator[list[Any]]:
    """The rows every statement hands back to Python, however the caller fetches them."""
    rows: list[Any] = []

    def counted(method: str) -> Any:
        def fetch(self: CursorWrapper, *args: Any) -> Any:
            found = getattr(self.cursor, method)(*args)
            rows.extend([found] if method == "fetchone" else found)
            return found

        return fetch

    with (
        mock.patch.object(CursorWrapper, "fetchone", counted("fetchone"), create=True),
        mock.patch.object(CursorWrapper, "fetchmany", counted("fetchmany"), create=True),
        mock.patch.object(CursorWrapper, "fetchall", counted("fetchall"), create=True),
    ):
        yield rows


@pytest.mark.django_db
def test_a_call_reads_one_tool_not_every_stored_list() -> None:
    """Ten servers of 300 tools (about 2.4 MB of stored lists): finding one tool reads a few statements and
    a few kilobytes, whether its name is plain or cut and hashed."""
    agent, _ = factories.agent("ci-bot")
    padding = "p" * 800
    for n in range(10):
        tools = [_spec(f"tool_{i}", description=padding) for i in range(299)] + [_spec(LONG)]
        _server(f"server-{n}", tools, agent)
    for name, tool in (("server-3__tool_7", "tool_7"), (gateway_name("server-3", LONG), LONG)):
        with CaptureQueriesContext(connection) as queries, _rows_read() as rows:
            found = catalog.find_tool(agent.pk, name)
        assert found is not None and (found.server, found.tool) == ("server-3", tool)
        assert found.spec["name"] == name
        assert len(queries.captured_queries) <= 3, [q["sql"] for q in queries.captured_queries]
        read = sum(len(repr(row)) for row in rows)
        assert read < 20_000, read  # one definition (and, for a cut name, one server's tool names)


# --- on the gateway process -----------------------------------------------------------------------------

HEADER_SCHEMA = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _modern_call(ghub: GatewayHub, name: str, arguments: dict[str, Any], **headers: str) -> httpx.Response:
    """One 2026-07-28 tools/call, as a client sends it: one HTTP request with its routing headers."""
    return httpx.post(
        ghub.url + "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": META},
        },
        headers={
            "Authorization": f"Bearer {ghub.token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": name,
            **headers,
        },
        timeout=60,
    )


def _body(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response, whether sent as JSON or as one SSE event."""
    if response.headers["content-type"].startswith("application/json"):
        return response.json()
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(data[-1])


@pytest.fixture
def odd(ghub: GatewayHub, demo_server) -> GatewayHub:
    """A server beside the demo one with a tool whose argument is mirrored in a header, and a tool no era
    can list (every tools/list of this agent logs it)."""
    server = McpServer.objects.create(
        slug="odd", name="Odd", url=demo_server.url, default_team=ghub.hub.server.default_team
    )
    server.tools = [
        {"name": "hdr", "inputSchema": HEADER_SCHEMA},
        {"name": "scalar_input", "inputSchema": {"type": "string"}},
    ]
    server.save()
    server.agents.add(ghub.hub.server.agents.get())
    return ghub


NOT_LISTED = "not valid in MCP"  # the gateway's warning, each time its tools/list handler runs


def test_a_modern_call_checks_its_mcp_param_headers_without_listing_every_tool(
    odd: GatewayHub, gateway: Gateway
) -> None:
    logged = len(gateway.log())
    mismatch = _modern_call(odd, "odd__hdr", {"region": "eu"}, **{"Mcp-Param-Region": "us"})
    assert mismatch.status_code == 400, mismatch.text
    assert mismatch.json()["error"]["code"] == types.HEADER_MISMATCH
    missing = _modern_call(odd, "odd__hdr", {"region": "eu"})
    assert missing.status_code == 400 and missing.json()["error"]["code"] == types.HEADER_MISMATCH
    assert not ToolCall.objects.exists()

    echoed = _body(_modern_call(odd, "demo__echo", {"text": "one tool"}))
    assert echoed["result"]["isError"] is False, echoed
    assert "one tool" in echoed["result"]["content"][0]["text"]
    # Neither call ran the tools/list handler (the SDK's default walk of it to find one input schema).
    assert NOT_LISTED not in gateway.log()[logged:]
    # tools/list itself still does (the warning is there to be seen).
    assert "demo__echo" in gateway_tests.list_tools(odd.url + "/mcp", odd.token, "2026-07-28")
    wait_until(lambda: NOT_LISTED in gateway.log()[logged:], 10, 0.1, what="the tools/list warning")
