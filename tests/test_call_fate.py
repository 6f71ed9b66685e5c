"""A call that reached its server is never sent again unless that is safe, and its unknown outcome is said so.

A scripted MCP server (Starlette under uvicorn, on a loopback port, in this process) answers each
``tools/call`` with the next step of its script: an HTTP status (the tool may or may not have run), a
result, an SSE stream that breaks after one event with an ``id:`` (the SDK then sends its reconnect GET, which
the server answers with a scripted status), a malformed answer, or a JSON-RPC error whose message holds a NUL.
The hub sends through the real MCP client, and through a Celery worker where the hub's retries matter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from approvals.mcp_client import McpError, ServerConfig, call_tool, run
from approvals.models import AuditEvent, McpServer, Round
from tests.hub import Hub, set_up_hub
from tests.live import LoopbackMcpServer

pytestmark = pytest.mark.timeout(120)

TOOLS = [
    {"name": "plain", "inputSchema": {"type": "object"}},
    {"name": "again", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": True}},
]
NUL = "\u0000"


@dataclass
class Script:
    """What the server answers: ``steps`` for each tools/call in turn (the last one repeats)."""

    steps: list[tuple[Any, ...]] = field(default_factory=lambda: [("result",)])
    get_status: int = 501
    calls: list[dict[str, Any]] = field(default_factory=list)
    gets: int = 0


def _rpc(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _done(rid: Any, text: str = "done") -> dict[str, Any]:
    return _rpc(rid, {"resultType": "complete", "content": [{"type": "text", "text": text}]})


def _sse(*events: str, pause: float = 0.0) -> StreamingResponse:
    async def body() -> Any:
        for number, event in enumerate(events):
            if number:
                await anyio.sleep(pause)
            yield event.encode()

    return StreamingResponse(body(), media_type="text/event-stream")


class ScriptedServer(LoopbackMcpServer):
    what = "the scripted server"

    def __init__(self) -> None:
        self.script = Script()
        super().__init__()

    async def endpoint(self, request: Request) -> Response:
        script = self.script
        if request.method != "POST":
            script.gets += 1
            return Response("no stream here", status_code=script.get_status, media_type="text/plain")
        body = json.loads(await request.body())
        rid = body.get("id")
        if body.get("method") == "tools/list":
            page = {"resultType": "complete", "tools": TOOLS, "ttlMs": 0, "cacheScope": "public"}
            return JSONResponse(_rpc(rid, page))
        if body.get("method") != "tools/call":
            return JSONResponse(
                {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}}, 404
            )
        script.calls.append({"headers": dict(request.headers), "params": body.get("params") or {}})
        step = script.steps[min(len(script.calls), len(script.steps)) - 1]
        kind = step[0]
        if kind == "status":  # e.g. a gateway's 504 after it forwarded the call
            headers = step[2] if len(step) > 2 else {}
            return Response("upstream trouble", status_code=step[1], headers=headers, media_type="text/plain")
        if kind == "state_only":
            return JSONResponse(_rpc(rid, {"resultType": "input_required", "requestState": "st-1"}))
        if kind == "sse_drop":
            token = body["params"]["_meta"].get("progressToken", "none")
            progress = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1, "total": 2, "message": "half way"},
            }
            return _sse(f"id: e1\nretry: 20\ndata: {json.dumps(progress)}\n\n")  # then the stream ends
        if kind == "malformed":
            return Response('{"jsonrpc": "2.0", "id": ', media_type="application/json")
        if kind == "nul_error":
            error = {"code": step[2], "message": f"it broke{NUL}here"}
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": error}, status_code=step[1])
        if kind == "nul_progress":
            token = body["params"]["_meta"].get("progressToken", "none")
            progress = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1, "message": f"step{NUL}1"},
            }
            events = (f"data: {json.dumps(progress)}\n\n", f"data: {json.dumps(_done(rid))}\n\n")
            return _sse(*events, pause=0.5)  # the progress is stored before the call ends
        return JSONResponse(_done(rid))


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def server(scripted: ScriptedServer) -> ScriptedServer:
    scripted.script = Script()
    return scripted


def _call(server: ScriptedServer, tool: str = "plain") -> McpError:
    """One tools/call through the MCP client (the stored tool definition: no tools/list)."""
    config = ServerConfig(url=server.url, timeout=5.0)
    definition = next(t for t in TOOLS if t["name"] == tool)
    with pytest.raises(McpError) as info:
        run(call_tool(config, tool, {}, tool=definition, call_timeout=5))
    return info.value


# ---- the MCP client: which answers prove the tool did not run --------------------------------------------

# Statuses that prove the server (or a proxy before it) refused the request before running it.
REFUSED = [307, 308, 400, 401, 403, 404, 405, 406, 411, 413, 414, 415, 422, 429, 431]
# Statuses that do not: a 5xx (a gateway's 502/504, a 503 with Retry-After from a proxy that had forwarded it)
# or another 4xx (409: a request with this Idempotency-Key is still running).
UNKNOWN = [408, 409, 410, 500, 501, 502, 503, 504]


def test_only_refusal_statuses_prove_the_tool_did_not_run(server: ScriptedServer) -> None:
    seen: dict[int, bool] = {}
    for status in REFUSED + UNKNOWN:
        headers = {"Location": "http://elsewhere.invalid/mcp"} if status in (307, 308) else {}
        if status in (429, 503):
            headers["Retry-After"] = "1"
        server.script = Script(steps=[("status", status, headers)])
        error = _call(server)
        assert len(server.script.calls) == 1, status
        seen[status] = error.may_have_run
        if error.may_have_run:
            assert "may have run" in error.message
    assert seen == {**dict.fromkeys(REFUSED, False), **dict.fromkeys(UNKNOWN, True)}


@pytest.mark.parametrize("get_status", [501, 405])
def test_a_dropped_stream_is_judged_by_the_post_not_the_reconnect_get(
    server: ScriptedServer, get_status: int
) -> None:
    server.script = Script(steps=[("sse_drop",)], get_status=get_status)
    error = _call(server)
    assert server.script.gets >= 1  # the SDK's reconnect GET, which 2026-07-28 no longer has
    assert error.code == "network_error", error
    assert error.may_have_run is True
    assert str(get_status) not in error.message


def test_a_lost_answer_after_the_post_was_accepted_may_have_run(server: ScriptedServer) -> None:
    server.script = Script(steps=[("malformed",)])
    error = _call(server)
    assert error.code == "malformed_response"
    assert error.may_have_run is True


@pytest.mark.parametrize(("status", "code"), [(200, -32603), (400, -32602)])
def test_a_server_error_message_with_a_nul_becomes_storable(
    server: ScriptedServer, status: int, code: int
) -> None:
    server.script = Script(steps=[("nul_error", status, code)])
    error = _call(server)
    assert error.code == "rpc_error" and error.rpc_code == code
    assert "it broke\ufffdhere" in error.message
    assert error.may_have_run is False  # the server's own answer (at 200), or a refusal (400)


# ---- through the hub: a Celery worker sends, retries, and ends the call ----------------------------------


@pytest.fixture
def fate_hub(worker: Any, server: ScriptedServer) -> Hub:
    hub = set_up_hub(server.url, slug="scripted", honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(tools=TOOLS)
    return hub


def _ends_unknown(hub: Hub, server: ScriptedServer, call_id: str, posts: int = 1) -> dict[str, Any]:
    body = hub.agent.wait(call_id, 60)
    assert body["status"] == "failed", body
    assert body["error"]["code"] == "outcome_unknown", body["error"]
    assert body["error"]["tool_may_have_run"] is True
    assert len(server.script.calls) == posts  # never sent again
    assert not AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").exists()
    return body


@pytest.mark.parametrize(
    "step", [("status", 504), ("status", 502), ("status", 503, {"Retry-After": "1"})], ids=str
)
def test_a_5xx_after_the_call_left_ends_outcome_unknown_and_ran_once(
    fate_hub: Hub, server: ScriptedServer, step: tuple[Any, ...]
) -> None:
    server.script = Script(steps=[step, ("result",)])
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    body = _ends_unknown(fate_hub, server, call_id)
    assert f"HTTP {step[1]}" in body["error"]["message"]


def test_a_5xx_to_a_round_retry_never_replays_its_request_state(
    fate_hub: Hub, server: ScriptedServer
) -> None:
    # The server answers with a state only (the hub retries at once, echoing it), then fails with a 504.
    server.script = Script(steps=[("state_only",), ("status", 504), ("result",)])
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    _ends_unknown(fate_hub, server, call_id, posts=2)
    assert server.script.calls[1]["params"]["requestState"] == "st-1"
    assert Round.objects.get(call_id=call_id).status == Round.Status.CLOSED


@pytest.mark.parametrize("get_status", [501, 405])
def test_a_dropped_stream_ends_outcome_unknown_and_ran_once(
    fate_hub: Hub, server: ScriptedServer, get_status: int
) -> None:
    server.script = Script(steps=[("sse_drop",), ("result",)], get_status=get_status)
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    body = _ends_unknown(fate_hub, server, call_id)
    assert f"HTTP {get_status}" not in body["error"]["message"]


@pytest.mark.parametrize("tool", ["plain", "again"])
def test_a_malformed_answer_after_the_call_ran_is_outcome_unknown_never_resent(
    fate_hub: Hub, server: ScriptedServer, tool: str
) -> None:
    # Even a tool safe to repeat is not sent again: the answer was lost, not refused.
    server.script = Script(steps=[("malformed",), ("result",)])
    call_id = fate_hub.agent.call(tool, {}, server="scripted")
    body = _ends_unknown(fate_hub, server, call_id)
    assert "not valid JSON-RPC" in body["error"]["message"]


@pytest.mark.parametrize(("status", "code"), [(200, -32603), (400, -32602)])
def test_a_nul_in_the_servers_error_message_ends_the_call(
    fate_hub: Hub, server: ScriptedServer, status: int, code: int
) -> None:
    server.script = Script(steps=[("nul_error", status, code), ("result",)])
    call_id = fate_hub.agent.call("again", {}, server="scripted")
    body = fate_hub.agent.wait(call_id, 30)
    assert body["status"] == "failed", body  # not left running for the stuck-call sweep
    assert body["error"]["code"] == "rpc_error"
    assert "it broke\ufffdhere" in body["error"]["message"]
    assert len(server.script.calls) == 1
    assert AuditEvent.objects.filter(call_id=call_id, verb="call.failed").exists()


def test_a_nul_in_a_progress_message_is_stored_readably(fate_hub: Hub, server: ScriptedServer) -> None:
    server.script = Script(steps=[("nul_progress",)])
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    body = fate_hub.agent.wait(call_id, 30)
    assert body["status"] == "completed", body
    assert body["progress"] is not None and body["progress"]["message"] == "step\ufffd1"
