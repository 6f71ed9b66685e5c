"""A server that lists a tool name twice: the hub keeps the first definition it lists under that name, drops
the later ones (as one tool, as the SDK's session knows it by name) and says so, on every path that lists
tools (a refresh, the probe in both eras, a list read on an open session), so that the stored list, the
admin, the gateway and routing all read one definition.

Against a real server built on the official SDK (this file run as a script: ``python THIS_FILE PORT``) whose
tools/list names ``lookup`` twice, the first time read-only, the second destructive, and ``other`` twice.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from approvals.mcp_client.toollist import ToolList, bounded

pytestmark = pytest.mark.timeout(120)

FIRST = "Looks a name up (the first definition)"
SECOND = "Deletes whatever it is given (a second definition under the same name)"


def _serve(port: int) -> None:
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations
    from starlette.responses import JSONResponse

    class ListsTwice(MCPServer):
        async def list_tools(self) -> list[Any]:
            tools = {tool.name: tool for tool in await super().list_tools()}
            lookup, other = tools["lookup"], tools["other"]
            destructive = ToolAnnotations(read_only_hint=False, destructive_hint=True)
            again = lookup.model_copy(update={"description": SECOND, "annotations": destructive})
            return [lookup, other, again, other.model_copy()]

    mcp = ListsTwice("lists-twice", version="1.0.0")

    @mcp.tool(description=FIRST, annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False))
    def lookup(query: str) -> str:
        return f"found {query}"

    @mcp.tool(description="Another tool")
    def other() -> str:
        return "other"

    app = mcp.streamable_http_app(json_response=True, stateless_http=True)

    async def ready(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/_ready":
            await JSONResponse({"ok": True})(scope, receive, send)
            return
        await app(scope, receive, send)

    uvicorn.run(ready, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
    sys.exit(0)


from approvals.mcp_client import ServerConfig  # noqa: E402
from approvals.mcp_client.probe import HANDSHAKE, MODERN  # noqa: E402
from approvals.mcp_client.session import Dispatcher, http_transport, list_tools_on, open_client  # noqa: E402
from approvals.models import AuditEvent, McpServer  # noqa: E402
from approvals.services import servers  # noqa: E402
from tests import factories  # noqa: E402
from tests.live import script_mcp_url  # noqa: E402


@pytest.fixture(scope="module")
def twice_url() -> Iterator[str]:
    with script_mcp_url(Path(__file__), "the server listing names twice") as url:
        yield url


def _kept(server: McpServer) -> list[tuple[str, str]]:
    stored = McpServer.objects.get(pk=server.pk).tools or []
    return [(tool["name"], tool.get("description", "")) for tool in stored]


def _latest(verb: str) -> dict[str, Any]:
    return AuditEvent.objects.filter(verb=verb).latest("id").data


# The pure rule.


def test_a_name_listed_again_is_dropped_and_counted() -> None:
    kept = ToolList()
    listed: list[dict[str, Any]] = [{"name": "a", "v": 1}, {"name": "b"}, {"name": "a", "v": 2}]
    for tool in [*listed, {"name": "b"}, {"name": "a"}]:
        assert kept.offer(tool) is True  # a dropped copy does not stop the listing
    assert list(kept) == [{"name": "a", "v": 1}, {"name": "b"}]
    assert kept.duplicates == 3
    summary = kept.summary()
    assert summary["tool_count"] == 2 and summary["duplicates"] == 3 and summary["duplicated"] == ["a", "b"]


def test_a_list_read_elsewhere_is_deduplicated_too() -> None:
    kept = bounded([{"name": "x", "n": 1}, {"name": "x", "n": 2}])
    assert list(kept) == [{"name": "x", "n": 1}] and kept.duplicates == 1


def test_the_names_a_summary_lists_as_duplicated_stay_bounded() -> None:
    kept = ToolList()
    for i in range(300):
        kept.offer({"name": f"t{i}" + "n" * 500})
        kept.offer({"name": f"t{i}" + "n" * 500})
    summary = kept.summary()
    assert summary["duplicates"] == 300
    assert len(summary["duplicated"]) == 50 and all(len(name) <= 128 for name in summary["duplicated"])


# Against the real server.


@pytest.mark.django_db
def test_a_refresh_keeps_the_first_definition_of_a_name_and_audits_the_rest(twice_url: str) -> None:
    server = factories.server("twice", url=twice_url, era=McpServer.Era.MODERN)
    servers.server_refresh_tools(server=server)
    assert _kept(server) == [("lookup", FIRST), ("other", "Another tool")]
    lookup = McpServer.objects.get(pk=server.pk).tool("lookup")
    assert lookup is not None and lookup["annotations"]["readOnlyHint"] is True
    event = _latest("server.tools_refreshed")
    assert event["tool_count"] == 2 and event["tools"] == ["lookup", "other"]
    assert event["duplicates"] == 2 and event["duplicated"] == ["lookup", "other"]


@pytest.mark.django_db
@pytest.mark.parametrize("era", [MODERN, HANDSHAKE])
def test_a_probe_keeps_one_definition_per_name_and_says_so(twice_url: str, era: str) -> None:
    server = factories.server("twice", url=twice_url, era=era)
    found = servers.server_probe(server)
    assert found["ok"] is True and found["era"] == era
    assert found["tool_count"] == 2 and found["tools_duplicated"] == 2
    assert _kept(server) == [("lookup", FIRST), ("other", "Another tool")]
    assert "2 listed twice, dropped" in servers.probe_summary(found)
    probed = _latest("server.probed")
    assert probed["tool_count"] == 2 and probed["tools_duplicated"] == 2


@pytest.mark.django_db
def test_a_list_read_on_an_open_session_keeps_one_definition_per_name(twice_url: str) -> None:
    server = factories.server("twice", url=twice_url, era=McpServer.Era.HANDSHAKE)

    async def main() -> list[dict[str, Any]]:
        dispatcher = Dispatcher()
        transport, http = http_transport(
            ServerConfig(url=twice_url, timeout=10), read_timeout=30, dispatcher=dispatcher
        )
        async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=10) as client:
            return await list_tools_on(client, timeout=30)

    listed = anyio.run(main)
    assert [tool["name"] for tool in listed] == ["lookup", "other"]
    servers.server_tools_changed(server.pk, tools=listed)
    assert _kept(server) == [("lookup", FIRST), ("other", "Another tool")]
    assert _latest("server.tools_refreshed")["duplicates"] == 2


@pytest.mark.django_db
def test_the_admin_shows_each_name_once(twice_url: str, admin_client: Any) -> None:
    server = factories.server("twice", url=twice_url, era=McpServer.Era.MODERN)
    servers.server_probe(server)
    page = admin_client.get(f"/admin/approvals/mcpserver/{server.pk}/change/").content.decode()
    assert "Tools: lookup, other" in page
    assert json.dumps(McpServer.objects.get(pk=server.pk).tools).count('"lookup"') == 1
