"""A tool's result is written before the hub lists the server's tools again, on the worker's send path
(`sending.call_send`) against a scripted 2026-07-28 server over HTTP whose tools/list is slow.

A result for a tool missing from the stored list makes the hub list the tools again. Before, that came
first: the result the tool had produced waited in the worker's memory for as long as the server took over
its tools/list (up to ELICIT_MCP_TIMEOUT), and a worker killed meanwhile left the call to end
``outcome_unknown`` although the server had answered."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from starlette.requests import Request
from starlette.responses import Response

from approvals.models import InputRequest, McpServer, RoutingRule, ToolCall
from approvals.services import sending
from tests import factories
from tests.test_sends_hostile import ScriptedServer, asking, done, rpc

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SLOW_LIST = 3.0  # seconds the server takes over tools/list
# What the server lists (the hub's stored list starts empty): the tool is read-only.
LISTED = [{"name": "plain", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]


class SlowListServer(ScriptedServer):
    what = "the scripted server with a slow tools/list"

    def __init__(self) -> None:
        self.listed_at: list[float] = []
        super().__init__()

    async def endpoint(self, request: Request) -> Response:
        if request.method != "POST":
            return Response("no stream here", status_code=405, media_type="text/plain")
        body = json.loads(await request.body())
        if body.get("method") == "tools/list":
            self.listed_at.append(time.time())
            await asyncio.sleep(SLOW_LIST)
            return rpc(
                body.get("id"),
                {"resultType": "complete", "tools": LISTED, "ttlMs": 0, "cacheScope": "public"},
            )
        params = body.get("params") or {}
        self.calls.append(params)
        step = self.steps[min(len(self.calls), len(self.steps)) - 1]
        return step(body.get("id"), params)


@pytest.fixture(scope="module")
def slow_list() -> Iterator[SlowListServer]:
    with SlowListServer() as server:
        yield server


def _call(server_url: str) -> ToolCall:
    release = factories.team("release")
    agent, _ = factories.agent("ci-bot")
    server = McpServer.objects.create(
        slug="slow", name="slow", url=server_url, default_team=release, tools=[]
    )
    agent.servers.add(server)
    return factories.call(server, agent, tool="plain", arguments={})


def test_a_result_is_written_before_the_tools_are_listed_again(slow_list: SlowListServer) -> None:
    slow_list.script(done)
    slow_list.listed_at.clear()
    call = _call(slow_list.url)
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert len(slow_list.calls) == 1
    assert slow_list.listed_at  # the stored list still learns of the tool, after
    assert call.finished_at is not None
    assert call.finished_at.timestamp() < slow_list.listed_at[-1]
    assert McpServer.objects.get(slug="slow").tool("plain") is not None


def test_a_round_still_routes_on_the_tool_list_fetched_again_first(slow_list: SlowListServer) -> None:
    """Input asked for a tool missing from the stored list: its round routes on the tool's annotations, so
    the list is fetched before the round opens (a rule for read-only tools sends it to its own team)."""
    form = {
        "method": "elicitation/create",
        "params": {"message": "Name?", "requestedSchema": {"type": "object", "properties": {}}},
    }
    slow_list.script(asking({"name": form}, "s1"), done)
    slow_list.listed_at.clear()
    call = _call(slow_list.url)
    readers = factories.team("readers")
    RoutingRule.objects.create(name="read-only tools", read_only=True, team=readers, position=1)
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT, call.error
    assert InputRequest.objects.get(round__call=call).team == readers
