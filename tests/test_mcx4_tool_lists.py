"""Hostile and careless tool lists, from a real server built on the official SDK, over HTTP and stdio: a name
listed twice keeps its first definition everywhere (the stored list, the probe of either transport, and the
session a call runs on), a cursor that comes round again ends the listing, and one tool too large to keep
is left out without hiding the tools after it.

This file run as a script is the server: ``python THIS_FILE http PORT MODE`` (stateless Streamable HTTP, with
``GET /_counts``: how many tools/list requests it answered) or ``python THIS_FILE stdio MODE``. `MODE`:

- ``twice``: ``lookup`` (structured output ``{"found": ...}``) listed again with another description and an
  output schema its results do not match; ``other`` listed twice.
- ``loop``: page ``a`` names the cursor ``again``; asked for ``again``, page ``b`` names ``again`` again.
- ``oversized``: ``small_a``, then ``huge`` (a description of `HUGE` bytes), then ``small_b``.
- ``huge_pages``: page after page (each naming a new cursor) of one tool as large as ``huge``.
- ``hang``: tools/list is never answered.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
from pydantic import BaseModel

FIRST = "Looks a name up (the first definition)"
SECOND = "Counts things (a second definition under the same name)"
HUGE = 5 * 1024 * 1024  # more than the hub keeps of a whole list
COUNTS = {"tools/list": 0}


class Found(BaseModel):
    found: str


def _server(mode: str) -> Any:
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ListToolsResult, PaginatedRequestParams

    class Hostile(MCPServer):
        async def _handle_list_tools(
            self, ctx: Any, params: PaginatedRequestParams | None
        ) -> ListToolsResult:
            COUNTS["tools/list"] += 1
            if mode == "hang":
                await anyio.sleep_forever()
            tools = {tool.name: tool for tool in await self.list_tools()}
            cursor = params.cursor if params is not None else None
            if mode == "twice":
                counts = {
                    "type": "object",
                    "properties": {"count": {"type": "integer"}},
                    "required": ["count"],
                }
                again = tools["lookup"].model_copy(update={"description": SECOND, "output_schema": counts})
                listed = [tools["lookup"], tools["other"], again, tools["other"].model_copy()]
                return ListToolsResult(tools=listed)
            if mode == "loop":
                page = "b" if cursor == "again" else "a"
                named = [tools["other"].model_copy(update={"name": f"{page}{i}"}) for i in range(5)]
                return ListToolsResult(tools=named, next_cursor="again")
            small = tools["other"]
            if mode == "huge_pages":
                page = int(cursor or 0)
                huge = small.model_copy(update={"name": f"huge{page}", "description": "h" * HUGE})
                return ListToolsResult(tools=[huge], next_cursor=str(page + 1))
            huge = small.model_copy(update={"name": "huge", "description": "h" * HUGE})
            listed = [
                small.model_copy(update={"name": "small_a"}),
                huge,
                small.model_copy(update={"name": "small_b"}),
            ]
            return ListToolsResult(tools=listed)

    mcp = Hostile("mcx4-hostile-lists", version="1.0.0")

    @mcp.tool(description=FIRST)
    def lookup(query: str) -> Found:
        return Found(found=query)

    @mcp.tool(description="Another tool")
    def other() -> str:
        return "other"

    return mcp


def _serve_http(port: int, mode: str) -> None:
    import uvicorn
    from starlette.responses import JSONResponse

    app = _server(mode).streamable_http_app(json_response=True, stateless_http=True)

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/_counts":
            await JSONResponse(COUNTS)(scope, receive, send)
            return
        await app(scope, receive, send)

    uvicorn.run(counted, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        _server(sys.argv[2]).run("stdio")
    else:
        _serve_http(int(sys.argv[2]), sys.argv[3])
    sys.exit(0)


import json  # noqa: E402
import shutil  # noqa: E402
import urllib.request  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from django.utils import timezone  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

from approvals.holder.stdio import StdioSupervisor  # noqa: E402
from approvals.mcp_client import Completed, ServerConfig, call_tool, run  # noqa: E402
from approvals.mcp_client.probe import HANDSHAKE, MODERN, ProbeResult, probe_open  # noqa: E402
from approvals.mcp_client.session import Dispatcher, open_client  # noqa: E402
from approvals.models import AuditEvent, Holder, McpServer  # noqa: E402
from approvals.services import servers  # noqa: E402
from approvals.services import stdio as stdio_service  # noqa: E402
from elicit_hub import engines  # noqa: E402
from tests import factories  # noqa: E402
from tests.live import free_port, start_script  # noqa: E402

pytestmark = pytest.mark.timeout(120)
THIS = Path(__file__).resolve()


class Served:
    def __init__(self, mode: str) -> None:
        self.base = f"http://127.0.0.1:{free_port()}"
        self.proc = start_script(
            THIS, ["http", self.base.rsplit(":", 1)[1], mode], self.lists, f"{mode} server"
        )
        self.url = self.base + "/mcp"

    def lists(self) -> int:
        with urllib.request.urlopen(self.base + "/_counts", timeout=2) as answer:
            return int(json.load(answer)["tools/list"])


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, Served]]:
    running = {mode: Served(mode) for mode in ("twice", "loop", "oversized", "huge_pages")}
    try:
        yield running
    finally:
        for server in running.values():
            server.proc.terminate()
            server.proc.wait(timeout=10)


def _stored(server: McpServer) -> list[dict[str, Any]]:
    return McpServer.objects.get(pk=server.pk).tools or []


def _latest(verb: str) -> dict[str, Any]:
    return AuditEvent.objects.filter(verb=verb).latest("id").data


def test_a_call_listing_the_tools_first_checks_its_result_by_the_first_definition(
    served: dict[str, Served],
) -> None:
    # No stored definition: the call lists the tools on its session, which must hold the definition the hub
    # keeps (the first), not the last one listed under the name.
    outcome = run(call_tool(ServerConfig(url=served["twice"].url, timeout=10), "lookup", {"query": "x"}))
    assert isinstance(outcome, Completed)
    assert outcome.result["structuredContent"] == {"found": "x"}
    assert outcome.output_schema_error is None


@pytest.mark.django_db
@pytest.mark.parametrize("era", [MODERN, HANDSHAKE])
def test_an_http_probe_names_the_tools_listed_twice(served: dict[str, Served], era: str) -> None:
    server = factories.server("twice", url=served["twice"].url, era=era)
    found = servers.server_probe(server)
    assert found["ok"] is True and found["tool_count"] == 2
    assert found["tools_duplicated"] == 2 and found["tools_duplicated_names"] == ["lookup", "other"]
    assert McpServer.objects.get(pk=server.pk).probe["tools_duplicated_names"] == ["lookup", "other"]
    assert "(2 listed twice, dropped: the first of each name is kept: 'lookup', 'other')" in (
        servers.probe_summary(found)
    )
    assert [(tool["name"], tool["description"]) for tool in _stored(server)] == [
        ("lookup", FIRST),
        ("other", "Another tool"),
    ]


@pytest.mark.django_db
def test_a_cursor_named_again_ends_the_listing(served: dict[str, Served]) -> None:
    loop = served["loop"]
    before = loop.lists()
    server = factories.server("loop", url=loop.url, era=MODERN)
    servers.server_refresh_tools(server=server)
    assert loop.lists() - before == 2  # page a, then page b: its cursor is the one asked for already
    assert [tool["name"] for tool in _stored(server)] == [f"a{i}" for i in range(5)] + [
        f"b{i}" for i in range(5)
    ]
    event = _latest("server.tools_refreshed")
    assert event["truncated"] is True and event["tool_count"] == 10 and event["duplicates"] == 0


@pytest.mark.django_db
@pytest.mark.parametrize("era", [MODERN, HANDSHAKE])
def test_a_cursor_named_again_ends_a_probe_and_says_the_list_is_cut(
    served: dict[str, Served], era: str
) -> None:
    loop = served["loop"]
    before = loop.lists()
    server = factories.server("loop", url=loop.url, era=era)
    found = servers.server_probe(server)
    assert loop.lists() - before == 2
    assert found["ok"] is True and found["tool_count"] == 10 and found["tools_truncated"] is True


@pytest.mark.django_db
def test_one_tool_too_large_to_keep_is_left_out_and_the_tools_after_it_are_kept(
    served: dict[str, Served],
) -> None:
    server = factories.server("oversized", url=served["oversized"].url, era=MODERN)
    servers.server_refresh_tools(server=server)
    assert [tool["name"] for tool in _stored(server)] == ["small_a", "small_b"]
    event = _latest("server.tools_refreshed")
    assert (
        event["oversized"] == 1 and event["truncated"] is False and event["tools"] == ["small_a", "small_b"]
    )


@pytest.mark.django_db
def test_pages_of_nothing_but_tools_too_large_to_keep_are_not_read_to_the_page_cap(
    served: dict[str, Served],
) -> None:
    huge = served["huge_pages"]
    before = huge.lists()
    server = factories.server("huge", url=huge.url, era=MODERN)
    servers.server_refresh_tools(server=server)
    assert huge.lists() - before == 4  # 5 MiB each: the fourth passes the 16 MiB left out as oversized
    assert _stored(server) == []
    event = _latest("server.tools_refreshed")
    assert event["truncated"] is True and event["oversized"] == 4


# A stdio server, run by the holder's supervisor in this process.


@pytest.fixture
def stdio_twice() -> McpServer:
    return McpServer.objects.create(
        slug="stdio-twice",
        name="stdio-twice",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(THIS), "stdio", "twice"],
        era=McpServer.Era.HANDSHAKE,
    )


@pytest.mark.usefixtures("live_db")
def test_a_stdio_probe_names_the_tools_listed_twice_as_an_http_probe_does(
    stdio_twice: McpServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    root = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex  # as in production: the server's user reaches it
    settings.ELICIT_STDIO_DIR = root
    holder = Holder.objects.create(name="host:1:mcx4", heartbeat_at=timezone.now())

    async def start() -> None:
        supervisor = StdioSupervisor(stdio_twice.pk, holder.name)
        try:
            async with supervisor.session(wait=30):  # open once the new session was probed
                pass
        finally:
            await supervisor.stop()

    try:
        anyio.run(start)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    stored = McpServer.objects.get(pk=stdio_twice.pk)
    assert stored.probe["ok"] is True and stored.probe["tool_count"] == 2
    assert stored.probe["tools_duplicated"] == 2
    assert stored.probe["tools_duplicated_names"] == ["lookup", "other"]
    assert [(tool["name"], tool["description"]) for tool in stored.tools] == [
        ("lookup", FIRST),
        ("other", "Another tool"),
    ]
    probed = _latest("server.probed")
    assert probed["server"] == "stdio-twice" and probed["tools_duplicated"] == 2
    assert any(
        "lists 2 tool(s) under a name listed before ('lookup', 'other')" in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.django_db
def test_a_stdio_tools_list_that_never_answers_gives_a_probe_saying_so_and_keeps_the_stored_tools() -> None:
    kept = [{"name": "echo", "inputSchema": {"type": "object"}}]
    server = McpServer.objects.create(
        slug="stdio-hang",
        name="stdio-hang",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(THIS), "stdio", "hang"],
        era=McpServer.Era.HANDSHAKE,
        tools=kept,
    )

    async def main() -> ProbeResult:
        dispatcher = Dispatcher()
        transport = stdio_client(StdioServerParameters(command=sys.executable, args=server.args))
        async with open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=10) as client:
            return await probe_open(client, latency_ms=1, timeout=1)

    found = anyio.run(main)
    assert found.ok is False and found.tools is None
    assert found.error is not None and found.error["code"] == "timeout"
    assert "tools/list" in found.error["message"]
    stdio_service.stdio_probed(server_id=server.pk, found=found.as_json(), tools=found.tools)
    stored = McpServer.objects.get(pk=server.pk)
    assert stored.probe["ok"] is False and stored.probe["error"]["code"] == "timeout"
    assert stored.tools == kept
