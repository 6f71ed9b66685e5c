"""Tool lists from a hostile MCP server: every path that lists tools (a refresh, a call to a tool the stored
list lacks, a changed list read on a session, the probe, the listing before a send) stops paging at the
hub's cap, stores at most the cap, audits a bounded event, and never fails on text PostgreSQL cannot
store. Against a real server over HTTP (tests/tool_flood_server.py) that pages without end."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.utils import timezone

from approvals.mcp_client import Completed, ServerConfig, call_tool, run
from approvals.mcp_client.probe import HANDSHAKE, MODERN
from approvals.mcp_client.session import Dispatcher, http_transport, list_tools_on, open_client
from approvals.models import AuditEvent, McpServer
from approvals.services import servers
from tests import factories
from tests.live import free_port, start_script

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).with_name("tool_flood_server.py")
CAP = 2_000  # tools a list keeps (toollist.MAX_TOOLS, the probe's limit before)
CAP_BYTES = 4 * 1024 * 1024  # their JSON (toollist.MAX_TOOLS_BYTES)
PER_PAGE = 50
PAGES_TO_CAP = CAP // PER_PAGE  # the page that fills the list is the last one asked for
NAMED = 50  # tool names an audit event lists at most


class Flood:
    def __init__(self) -> None:
        self.base = f"http://127.0.0.1:{free_port()}"
        self.proc = start_script(SCRIPT, [self.base.rsplit(":", 1)[1]], self.reset, "tool_flood_server.py")

    def url(self, mode: str) -> str:
        return f"{self.base}/{mode}/mcp" + (f"?per_page={PER_PAGE}" if mode == "flood" else "?kb=32")

    def pages(self, mode: str) -> int:
        with urllib.request.urlopen(self.base + "/_pages", timeout=5) as answer:
            return int(json.load(answer).get(mode, 0))

    def reset(self) -> None:
        urllib.request.urlopen(
            urllib.request.Request(self.base + "/_reset", method="POST"), timeout=2
        ).close()


@pytest.fixture(scope="module")
def flood_server() -> Iterator[Flood]:
    server = Flood()
    try:
        yield server
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=10)


@pytest.fixture
def flood(flood_server: Flood) -> Flood:
    flood_server.reset()
    return flood_server


def _registered(flood: Flood, mode: str) -> McpServer:
    """The server as the hub knows it after a probe long ago: a 2026-07-28 server with one stale tool."""
    server = factories.server(mode, url=flood.url(mode), tools=[{"name": "tool_0"}])
    server.probe = {"ok": True, "era": MODERN}
    server.tools_fetched_at = timezone.now() - timedelta(days=1)
    server.save()
    return server


def _list_on_session(url: str) -> list[dict[str, Any]]:
    """What a holder does on ``notifications/tools/list_changed``: list the tools on its open session."""

    async def main() -> list[dict[str, Any]]:
        dispatcher = Dispatcher()
        transport, http = http_transport(
            ServerConfig(url=url, timeout=10), read_timeout=30, dispatcher=dispatcher
        )
        async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=10) as client:
            return await list_tools_on(client, timeout=30)

    return anyio.run(main)


def _relist(server: McpServer, trigger: str) -> None:
    """Make the hub list the server's tools again, the way `trigger` does."""
    if trigger == "unknown_tool":  # a call answered for a tool the stored list lacks
        servers.server_after_send(server, "tool_1234", outcome=Completed({"content": []}))
    elif trigger == "list_changed":  # a 2026-07-28 server's notice: the hub lists them itself
        servers.server_tools_changed(server.pk)
    else:  # a holder's session heard the notice and listed them on it
        servers.server_tools_changed(server.pk, tools=_list_on_session(server.url))


def _refreshed(server: McpServer) -> dict[str, Any]:
    return (
        AuditEvent.objects.filter(verb="server.tools_refreshed", data__server=server.slug).latest("id").data
    )


TRIGGERS = ["unknown_tool", "list_changed", "session"]


@pytest.mark.django_db
@pytest.mark.parametrize("trigger", TRIGGERS)
def test_a_server_that_pages_forever_is_read_up_to_the_cap_and_stored_bounded(
    flood: Flood, trigger: str
) -> None:
    server = _registered(flood, "flood")
    _relist(server, trigger)
    assert flood.pages("flood") == PAGES_TO_CAP  # not the 100 pages the server would go on sending
    stored = McpServer.objects.get(pk=server.pk).tools or []
    assert [tool["name"] for tool in stored] == [f"tool_{i}" for i in range(CAP)]
    event = _refreshed(server)
    assert event["tool_count"] == CAP and event["truncated"] is True
    assert event["tools"] == [f"tool_{i}" for i in range(NAMED)]
    assert len(json.dumps(event)) < 4_000


@pytest.mark.django_db
def test_a_list_of_huge_tools_stops_at_the_byte_cap(flood: Flood) -> None:
    server = _registered(flood, "heavy")
    servers.server_refresh_tools(server=server)
    stored = McpServer.objects.get(pk=server.pk).tools or []
    size = len(json.dumps(stored, separators=(",", ":")))
    assert CAP_BYTES - 40_000 < size <= CAP_BYTES  # 32 KB tools, as many as fit
    # 8 tools a page: the page with the first tool that does not fit is the last one asked for.
    assert flood.pages("heavy") == len(stored) // 8 + 1
    assert _refreshed(server)["truncated"] is True


@pytest.mark.django_db
@pytest.mark.parametrize("era", [MODERN, HANDSHAKE])
def test_a_probe_stops_paging_at_the_cap_and_says_the_list_is_truncated(flood: Flood, era: str) -> None:
    server = factories.server("flood", url=flood.url("flood"), era=era)
    found = servers.server_probe(server)
    assert flood.pages("flood") == PAGES_TO_CAP
    assert found["ok"] is True and found["era"] == era
    assert found["tool_count"] == CAP and found["tools_truncated"] is True
    assert f"{CAP} tool(s) (the first ones: the server lists more)" in servers.probe_summary(found)
    assert len(McpServer.objects.get(pk=server.pk).tools or []) == CAP
    probed = AuditEvent.objects.filter(verb="server.probed").latest("id").data
    assert probed["tool_count"] == CAP and probed["tools_truncated"] is True


def test_a_call_to_a_tool_on_the_first_pages_works_without_reading_every_page(flood: Flood) -> None:
    config = ServerConfig(url=flood.url("flood"), timeout=10)
    outcome = run(call_tool(config, "tool_7", {"x": "y"}))  # no stored definition: the tools are listed first
    assert isinstance(outcome, Completed)
    assert outcome.result["content"][0]["text"] == "called tool_7"
    assert flood.pages("flood") == PAGES_TO_CAP


@pytest.mark.django_db
@pytest.mark.parametrize("trigger", TRIGGERS)
def test_tools_with_a_nul_are_left_out_and_the_list_is_stored(flood: Flood, trigger: str) -> None:
    server = _registered(flood, "nul")
    _relist(server, trigger)  # PostgreSQL refuses a NUL in jsonb: storing it as received would raise
    stored = McpServer.objects.get(pk=server.pk).tools or []
    assert [tool["name"] for tool in stored] == ["fine", "also_fine"]
    event = _refreshed(server)
    assert event["tools"] == ["fine", "also_fine"] and event["unstorable"] == 2
    assert event["truncated"] is False
