"""Pages of the gateway's `tools/list` (`cursor` / `nextCursor`), and the cursors an agent may send.

An agent of many servers with many tools each got every tool in one response. Now a page holds at most
ELICIT_GATEWAY_PAGE_SIZE tools in one fixed order, a walk shows each tool once even when servers are added or
removed between pages, and a cursor that is not one the hub gave this agent for this endpoint (altered, huge,
another agent's, another endpoint's, another hub secret's) is JSON-RPC -32602, in both eras. First on
PostgreSQL, then on real parts: the gateway process, Redis, a Celery worker, the demo MCP server, the official
Python SDK client in both eras and the official TypeScript SDK client.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any
from unittest import mock

import anyio
import httpx
import mcp_types as types
import pytest
from django.core import signing
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from mcp.shared.exceptions import MCPError

from approvals.gateway import catalog, paging
from approvals.gateway.catalog import ExposedTool, Position
from approvals.gateway.names import gateway_name
from approvals.models import AgentClient, McpServer
from tests import factories
from tests import test_gateway as gateway_tests
from tests.test_gateway import MODES, Gateway, GatewayHub, _client, _node, _ts_client
from tests.test_gateway_lookup import _rows_read

# The gateway tests' fixtures: one gateway process for this module, a fresh hub for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(300)

LONG = "a_tool_name_longer_than_the_sixty_four_characters_a_position_keeps_" * 2


def _spec(name: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


def _server(slug: str, tools: Any, agent: AgentClient | None = None, **extra: Any) -> McpServer:
    server = factories.server(slug, **extra)
    server.tools = tools
    server.save()
    if agent is not None:
        server.agents.add(agent)
    return server


def _walk(agent_id: int, slug: str | None, size: int, between: Any = None) -> list[list[ExposedTool]]:
    """Every page of the agent's tools, as the gateway cuts them (``between(n)`` runs after page n)."""
    pages: list[list[ExposedTool]] = []
    after: Position | None = None
    while True:
        page = catalog.exposed_tools(agent_id, slug, after=after, limit=size + 1)
        pages.append(page[:size])
        if len(page) <= size:
            return pages
        after = catalog.position(page[size - 1].server, page[size - 1].name)
        if between is not None:
            between(len(pages))


# --- the order of the pages, on PostgreSQL --------------------------------------------------------------


@pytest.fixture
def agent(db: None) -> AgentClient:
    agent, _ = factories.agent("ci-bot")
    _server(
        "demo",
        [
            _spec("echo", description="first"),
            _spec("echo", description="the same name again: counts once, the first wins"),
            _spec(LONG + "b"),
            _spec(LONG + "a"),
            _spec(LONG[:64]),
            *[_spec(f"tool_{i:02}") for i in range(12)],
        ],
        agent,
    )
    # Servers registered before slugs were refused `__`: `a` + `b__c` and `a__b` + `c` share `a__b__c`.
    _server("a", [_spec("b__c"), _spec("only_a")], agent)
    _server("a__b", [_spec("c"), _spec("only_ab")], agent)
    _server("zeta", [_spec(f"z{i}") for i in range(5)], agent)
    _server("others", [_spec("echo")])  # not this agent's
    return agent


@pytest.mark.parametrize("size", [1, 3, 7, 100])
def test_pages_show_every_tool_once_in_one_order(agent: AgentClient, size: int) -> None:
    for slug in (None, "demo"):
        everything = catalog.exposed_tools(agent.pk, slug)
        pages = _walk(agent.pk, slug, size)
        assert [tool for page in pages for tool in page] == everything
        assert all(0 < len(page) <= size for page in pages)
        at = [catalog.position(tool.server, tool.name) for tool in everything]
        assert at == sorted(at) and len(set(at)) == len(at)
    names = [tool.name for tool in catalog.exposed_tools(agent.pk)]
    assert "a__b__c" not in names and "others__echo" not in names
    assert {"a__only_a", "a__b__only_ab", "demo__echo", gateway_name("demo", LONG + "a")} <= set(names)
    long_names = [tool.name for tool in catalog.exposed_tools(agent.pk, "demo") if tool.name.startswith(LONG)]
    assert sorted(long_names) == sorted([LONG + "a", LONG + "b"])
    first_echo = next(t for t in catalog.exposed_tools(agent.pk, "demo", limit=100) if t.name == "echo")
    assert first_echo.spec["description"] == "first"


def test_a_walk_shows_no_tool_twice_and_skips_none_that_stayed_as_servers_change(agent: AgentClient) -> None:
    stayed = {tool.name for tool in catalog.exposed_tools(agent.pk) if not tool.name.startswith("zeta__")}

    def change(page: int) -> None:
        if page == 1:  # before and after the walk's position, and one it has not reached yet
            _server("0early", [_spec("new_before")], agent)
            _server("zz", [_spec("new_after")], agent)
            McpServer.objects.filter(slug="zeta").delete()
        if page == 3:  # a server whose tools were all listed already goes; another's list grows
            McpServer.objects.filter(slug="a").delete()
            demo = McpServer.objects.get(slug="demo")
            demo.tools = [_spec("aaa_first"), *demo.tools, _spec("zzz_last")]
            demo.save()

    pages = _walk(agent.pk, None, 3, change)
    shown = [tool.name for page in pages for tool in page]
    assert len(shown) == len(set(shown))
    assert stayed <= set(shown)
    assert "zz__new_after" in shown and "demo__zzz_last" in shown
    assert "0early__new_before" not in shown and "demo__aaa_first" not in shown  # before the position
    assert not any(name.startswith("zeta__") for name in shown)


@pytest.mark.django_db
def test_a_page_reads_its_own_definitions_not_every_stored_list() -> None:
    """Ten servers of 300 tools (about 2.4 MB of stored lists): a page of 100 hands Python the names of the
    servers it reaches and 100 definitions, not every list, wherever the walk is."""
    agent, _ = factories.agent("ci-bot")
    padding = "p" * 800
    for n in range(10):
        _server(f"server-{n}", [_spec(f"tool_{i:03}", description=padding) for i in range(300)], agent)
    after = None
    for expected in ("server-0__tool_000", "server-0__tool_100", "server-0__tool_200", "server-1__tool_000"):
        with CaptureQueriesContext(connection) as queries, _rows_read() as rows:
            page = catalog.exposed_tools(agent.pk, after=after, limit=101)
        assert page[0].name == expected and len(page) == 101
        assert len(queries.captured_queries) <= 4, [q["sql"] for q in queries.captured_queries]
        read = sum(len(repr(row)) for row in rows)
        assert read < 200_000, read  # 101 definitions of about 900 bytes, and two servers' names
        after = catalog.position(page[99].server, page[99].name)


def test_a_list_refreshed_between_a_pages_reads_does_not_end_the_walk(agent: AgentClient) -> None:
    """The names are read, then the page's definitions: a refresh in between that drops one of the page's
    tools made a page short, which a client reads as the last one (every tool after it was never shown)."""
    real = catalog._definitions
    refreshed: list[bool] = []

    def refresh_first(tools: list[tuple[int, str]]) -> dict[tuple[int, str], dict[str, Any]]:
        if not refreshed:  # the demo server's hourly refresh, at the worst moment: tool_01 is gone
            demo = McpServer.objects.get(slug="demo")
            demo.tools = [tool for tool in demo.tools if tool["name"] != "tool_01"]
            demo.save()
            refreshed.append(True)
        return real(tools)

    with mock.patch.object(catalog, "_definitions", refresh_first):
        page = catalog.exposed_tools(agent.pk, "demo", limit=6)
    assert refreshed and len(page) == 6  # a full page: the client asks for the next one
    assert [tool.name for tool in page][-3:] == ["echo", "tool_00", "tool_02"]


def test_a_collision_an_upstream_makes_is_logged_quoted_and_cut(
    agent: AgentClient, caplog: pytest.LogCaptureFixture
) -> None:
    """An upstream names one tool exactly as the hub mends another's name (a newline carrying a forged log
    line, and a megabyte): both are left out, and the warning neither breaks the log's lines nor repeats the
    megabyte on every page."""
    forged = "x\n2026-12-06 12:00:00 CRITICAL audit chain broken " + "y" * 1_000_000
    mended = gateway_name("evil", forged)
    _server("evil", [_spec(forged), _spec(mended.removeprefix("evil__")), _spec("fine")], agent)
    with caplog.at_level("WARNING", logger="approvals.gateway.catalog"):
        names = [tool.name for tool in catalog.exposed_tools(agent.pk, limit=100)]
    assert mended not in names and "evil__fine" in names
    warnings = [record.getMessage() for record in caplog.records if "is left out" in record.getMessage()]
    assert warnings and all("\n" not in line and len(line) < 1_000 for line in warnings), warnings
    evil = [line for line in warnings if "'evil'" in line]
    assert evil and "the server names one tool as the hub cuts or mends" in evil[0], warnings


# --- cursors ---------------------------------------------------------------------------------------------


def _refused(cursor: str, agent_id: int, slug: str | None) -> None:
    with pytest.raises(MCPError) as caught:
        paging.position_of(cursor, agent_id, slug)
    assert caught.value.error.code == types.INVALID_PARAMS
    assert caught.value.error.data == {"reason": "invalid_cursor"}


def test_a_cursor_fits_only_its_agent_and_endpoint_and_this_hubs_secret(agent: AgentClient) -> None:
    other, _ = factories.agent("other-bot")
    at = catalog.position("demo", gateway_name("demo", LONG + "a"))
    cursor = paging.cursor_for(at, agent.pk, None)
    assert paging.position_of(cursor, agent.pk, None) == at
    assert len(cursor) < paging.MAX_CURSOR
    # It holds the position alone: the agent and the endpoint are in its key, not in it.
    assert json.loads(signing.b64_decode(cursor.split(":")[0].encode())) == list(at)
    _refused(cursor, other.pk, None)  # another agent
    _refused(cursor, agent.pk, "demo")  # another endpoint
    _refused(cursor[:-1] + ("A" if cursor[-1] != "A" else "B"), agent.pk, None)  # altered
    _, signature = cursor.rsplit(":", 1)
    forged = signing.b64_encode(json.dumps(["zeta", "z", ""]).encode()).decode()
    _refused(f"{forged}:{signature}", agent.pk, None)
    with override_settings(SECRET_KEY="another hub's secret key, long enough to pass as one" * 2):
        elsewhere = paging.cursor_for(at, agent.pk, None)
    _refused(elsewhere, agent.pk, None)
    for junk in ("", "x", ":", "a" * 5000, cursor + "x" * paging.MAX_CURSOR, "\u0000:\u0000"):
        _refused(junk, agent.pk, None)
    # Signed by this hub, but not a position (no cursor the hub gives looks like this).
    signer = signing.Signer(salt=f"approvals.gateway.tools-cursor:{agent.pk}:")
    for wrong in ({"a": 1}, ["a", "b"], ["a", "b", 3], "abc"):
        _refused(signer.sign_object(wrong), agent.pk, None)
    # The longest cursor the hub can give (a 50-character slug, a name of characters JSON escapes) fits.
    widest = catalog.position("d" * 50, "\U0001f600" * 200)
    assert len(paging.cursor_for(widest, agent.pk, "d" * 50)) < paging.MAX_CURSOR


# --- on the gateway process ------------------------------------------------------------------------------

BULK = 250


@pytest.fixture
def bulk(ghub: GatewayHub, demo_server) -> GatewayHub:
    """Beside the demo server, one of BULK tools (and one no era can list), for the same agent."""
    server = McpServer.objects.create(
        slug="bulk", name="Bulk", url=demo_server.url, default_team=ghub.hub.server.default_team
    )
    server.tools = [_spec(f"tool_{i:03}") for i in range(BULK)] + [
        {"name": "tool_100a", "inputSchema": {"type": "string"}}
    ]
    server.save()
    server.agents.add(ghub.hub.server.agents.get())
    return ghub


def _page(url: str, token: str, mode: str, cursor: str | None) -> tuple[list[str], str | None]:
    """One page of tools/list from the official Python SDK client, on a connection of its own."""

    async def run() -> tuple[list[str], str | None]:
        http, client = _client(url, token, mode)
        async with http, client:
            page = await client.list_tools(cursor=cursor)
            return [tool.name for tool in page.tools], page.next_cursor

    return anyio.run(run)


def _pages(url: str, token: str, mode: str, between: Any = None) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while len(pages) < 50:
        names, cursor = _page(url, token, mode, cursor)
        pages.append(names)
        if cursor is None:
            return pages
        if between is not None:
            between(len(pages))
    raise AssertionError("tools/list never ended")


def _expected(agent_id: int, slug: str | None) -> list[str]:
    return [tool.name for tool in catalog.exposed_tools(agent_id, slug) if tool.tool != "tool_100a"]


@pytest.mark.parametrize("mode", MODES)
def test_the_python_sdk_client_walks_the_pages_in_both_eras(bulk: GatewayHub, mode: str) -> None:
    size = paging.page_size()
    agent_id = bulk.hub.server.agents.get().pk
    for path, slug in (("/mcp", None), ("/mcp/bulk", "bulk")):
        expected = _expected(agent_id, slug)
        assert len(expected) > size  # more than one page
        pages = _pages(bulk.url + path, bulk.token, mode)
        assert [name for page in pages for name in page] == expected
        assert len(pages) == -(-(len(expected) + 1) // size)  # the unlisted tool takes a place on its page
        assert all(len(page) <= size for page in pages)


def test_the_typescript_sdk_client_walks_every_page(bulk: GatewayHub) -> None:
    done = subprocess.run(
        [_node(), _ts_client(), bulk.url + "/mcp", bulk.token, "demo__echo", '{"text": "last page"}'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events and "tools" in events[0], done.stdout + done.stderr
    expected = _expected(bulk.hub.server.agents.get().pk, None)
    assert events[0]["tools"] == expected
    assert events[0]["pages"] == -(-(len(expected) + 1) // paging.page_size())
    # A tool of the last page, called through the gateway.
    results = [event["result"] for event in events if "result" in event]
    assert results and "last page" in json.dumps(results[0]), events


def test_a_walk_over_the_wire_survives_servers_added_and_removed(bulk: GatewayHub) -> None:
    agent = bulk.hub.server.agents.get()
    before = set(_expected(agent.pk, None))

    def change(page: int) -> None:
        if page == 1:
            _server("aaa", [_spec("new_before")], agent)
            _server("zzz", [_spec("new_after")], agent)
            McpServer.objects.filter(slug="demo").update(enabled=False)  # after the position: not listed yet

    pages = _pages(bulk.url + "/mcp", bulk.token, "2026-07-28", change)
    shown = [name for page in pages for name in page]
    assert len(shown) == len(set(shown))
    assert {name for name in before if not name.startswith("demo__")} <= set(shown)
    assert "zzz__new_after" in shown and "aaa__new_before" not in shown
    assert not any(name.startswith("demo__") for name in shown)


def _list_with(url: str, token: str, mode: str, cursor: str) -> MCPError:
    """The error a tools/list with ``cursor`` raises in the Python SDK client (a handshake-era client
    raises it from its task group)."""

    async def run() -> None:
        http, client = _client(url, token, mode)
        async with http, client:
            await client.list_tools(cursor=cursor)

    try:
        anyio.run(run)
    except BaseException as exc:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if isinstance(exc, MCPError):
            return exc
        raise
    raise AssertionError(f"the cursor {cursor[:50]!r} was accepted")


@pytest.mark.parametrize("mode", MODES)
def test_a_cursor_the_hub_did_not_give_this_agent_here_is_invalid_params(
    bulk: GatewayHub, gateway: Gateway, mode: str
) -> None:
    _, real = _page(bulk.url + "/mcp", bulk.token, mode, None)
    assert real is not None
    _, other_token = factories.agent("other-bot", servers=[McpServer.objects.get(slug="bulk")])
    with override_settings(SECRET_KEY="another hub's secret key, long enough to pass as one" * 2):
        elsewhere = paging.cursor_for(("bulk", "bulk__tool_010", ""), bulk.hub.server.agents.get().pk, None)
    logged = len(gateway.log())
    for url, token, cursor in [
        (bulk.url + "/mcp", other_token, real),  # another agent's cursor
        (bulk.url + "/mcp/bulk", bulk.token, real),  # the /mcp cursor on /mcp/<slug>
        (bulk.url + "/mcp", bulk.token, ("B" if real[0] == "A" else "A") + real[1:]),  # altered
        (bulk.url + "/mcp", bulk.token, elsewhere),  # signed with another hub's secret
        (bulk.url + "/mcp", bulk.token, "x" * 500_000),  # huge
        (bulk.url + "/mcp", bulk.token, ""),
    ]:
        error = _list_with(url, token, mode, cursor)
        assert error.error.code == types.INVALID_PARAMS, error
        assert error.error.data == {"reason": "invalid_cursor"}
        assert "cursor" in error.error.message
    # The refusals are not the handler's failures (no traceback, no "could not serve").
    assert "Traceback" not in gateway.log()[logged:]
    # The right agent's cursor still works.
    names, _ = _page(bulk.url + "/mcp", bulk.token, mode, real)
    assert names and names[0] == _expected(bulk.hub.server.agents.get().pk, None)[paging.page_size()]


def test_a_raw_cursor_of_the_wrong_type_is_invalid_params_not_a_server_error(bulk: GatewayHub) -> None:
    meta = {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    }
    for cursor in (7, {"a": 1}, ["x"]):
        response = httpx.post(
            bulk.url + "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": cursor, **meta}},
            headers={
                "Authorization": f"Bearer {bulk.token}",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2026-07-28",
                "Mcp-Method": "tools/list",
            },
            timeout=30,
        )
        assert response.status_code < 500, response.text
        assert response.json()["error"]["code"] == types.INVALID_PARAMS, response.text
