"""A hostile or buggy MCP 2026-07-28 server against the worker's send path.

A scripted server (Starlette under uvicorn, on a loopback port, in this process) answers each ``tools/call``
with the next step of its script. The hub sends through the real MCP client, and through a Celery worker where
what the hub stores, audits and sends back matters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from approvals.mcp_client import Completed, McpError, ServerConfig, call_tool, run
from approvals.models import AuditEvent, InputRequest, McpServer
from tests.hub import Hub, set_up_hub
from tests.live import LoopbackMcpServer

pytestmark = pytest.mark.timeout(120)

TOOLS = [{"name": "plain", "inputSchema": {"type": "object"}}]
Step = Callable[[Any, dict[str, Any]], Response]
HUGE = 200_000  # characters of one value from the server: far more than any message may quote


def rpc(rid: Any, result: dict[str, Any], status: int = 200) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": result}, status_code=status)


def rpc_error(rid: Any, code: int, message: str, data: Any, status: int) -> JSONResponse:
    error = {"code": code, "message": message, "data": data}
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": error}, status_code=status)


def done(rid: Any, params: dict[str, Any]) -> Response:
    """Complete, saying what the retry carried (its answers, and its requestState or ABSENT)."""
    seen = {"responses": params.get("inputResponses"), "state": params.get("requestState", "ABSENT")}
    return rpc(rid, {"resultType": "complete", "content": [{"type": "text", "text": json.dumps(seen)}]})


def asking(requests: dict[str, Any], state: str | None = "state-1") -> Step:
    """An input_required result with these input requests (and this requestState, unless None)."""

    def step(rid: Any, params: dict[str, Any]) -> Response:
        result: dict[str, Any] = {"resultType": "input_required", "inputRequests": requests}
        if state is not None:
            result["requestState"] = state
        return rpc(rid, result)

    return step


def with_header(step: Step, name: bytes, value: bytes) -> Step:
    def headed(rid: Any, params: dict[str, Any]) -> Response:
        response = step(rid, params)
        response.raw_headers.append((name, value))
        return response

    return headed


FORM = {
    "method": "elicitation/create",
    "params": {
        "message": "Which name?",
        "requestedSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
}
SAMPLING = {
    "method": "sampling/createMessage",
    "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5},
}
ROOTS = {"method": "roots/list"}


class ScriptedServer(LoopbackMcpServer):
    what = "the scripted server"

    def __init__(self) -> None:
        self.steps: list[Step] = [done]
        self.calls: list[dict[str, Any]] = []
        super().__init__()

    def script(self, *steps: Step) -> None:
        self.steps, self.calls = list(steps), []

    async def endpoint(self, request: Request) -> Response:
        if request.method != "POST":
            return Response("no stream here", status_code=405, media_type="text/plain")
        body = json.loads(await request.body())
        rid = body.get("id")
        if body.get("method") == "tools/list":
            return rpc(rid, {"resultType": "complete", "tools": TOOLS, "ttlMs": 0, "cacheScope": "public"})
        if body.get("method") != "tools/call":
            return rpc_error(rid, -32601, "no", None, 404)
        params = body.get("params") or {}
        self.calls.append(params)
        step = self.steps[min(len(self.calls), len(self.steps)) - 1]
        return step(rid, params)


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def server(scripted: ScriptedServer) -> ScriptedServer:
    scripted.script(done)
    return scripted


def _call(server: ScriptedServer) -> Any:
    """One tools/call through the MCP client (the stored tool definition: no tools/list)."""
    config = ServerConfig(url=server.url, timeout=5.0)
    return run(call_tool(config, "plain", {}, tool=TOOLS[0], call_timeout=5))


def _failure(server: ScriptedServer) -> McpError:
    with pytest.raises(McpError) as info:
        _call(server)
    return info.value


# ---- a Retry-After header the hub cannot read ------------------------------------------------------------

# "²" is a digit to str.isdigit(), but not one float() reads; latin-1 on the wire, as HTTP headers are.
SUPERSCRIPT_TWO = b"\xb2"


def test_a_result_with_an_unreadable_retry_after_header_is_kept(server: ScriptedServer) -> None:
    server.script(with_header(done, b"retry-after", SUPERSCRIPT_TWO))
    outcome = _call(server)
    assert isinstance(outcome, Completed), outcome
    assert len(server.calls) == 1


def test_a_429_with_an_unreadable_retry_after_is_still_a_refusal(server: ScriptedServer) -> None:
    def limited(rid: Any, params: dict[str, Any]) -> Response:
        return Response("slow down", status_code=429, media_type="text/plain")

    server.script(with_header(limited, b"retry-after", SUPERSCRIPT_TWO))
    error = _failure(server)
    assert error.code == "rate_limited", error
    assert error.may_have_run is False  # a 429 proves the tool did not run: retried with backoff
    assert error.retry_after is None


# ---- what a server sends is quoted in error messages only in part ------------------------------------------


def _huge_version(rid: Any, params: dict[str, Any]) -> Response:
    supported = ["2025-11-25", "v" * HUGE, *(f"v{n}" for n in range(1000))]
    data = {"supported": supported, "requested": "2026-07-28"}
    return rpc_error(rid, -32022, "Unsupported protocol version", data, 400)


HOSTILE = {
    "method": asking({"k": {"method": "m" * HUGE}}),
    "mode": asking(
        {"k": {"method": "elicitation/create", "params": {"message": "?", "mode": ["y" * 100] * 2000}}}
    ),
    "result_type": lambda rid, params: rpc(rid, {"resultType": "r" * HUGE}),
    "versions": _huge_version,
}


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_an_error_message_quotes_only_a_bounded_part_of_the_servers_answer(
    server: ScriptedServer, hostile: str
) -> None:
    server.script(HOSTILE[hostile])
    error = _failure(server)
    assert error.code in ("unsupported_input_request", "malformed_response", "protocol_unsupported"), error
    assert len(error.message) < 1000, len(error.message)


def test_a_huge_method_name_stays_out_of_the_calls_error_and_the_audit_log(
    fate_hub: Hub, server: ScriptedServer
) -> None:
    server.script(HOSTILE["method"])
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    body = fate_hub.agent.wait(call_id, 30)
    assert body["status"] == "failed", body
    assert body["error"]["code"] == "unsupported_input_request"
    assert "'mmmm" in body["error"]["message"]  # it still says what the server asked for
    assert len(json.dumps(body["error"])) < 1000
    failed = AuditEvent.objects.get(call_id=call_id, verb="call.failed")
    assert len(json.dumps(failed.data)) < 1000


# ---- through the hub: a Celery worker sends, opens rounds, retries ---------------------------------------


@pytest.fixture
def fate_hub(worker: Any, server: ScriptedServer) -> Hub:
    hub = set_up_hub(server.url, slug="scripted", honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(tools=TOOLS)
    return hub


def _answered_text(body: dict[str, Any]) -> dict[str, Any]:
    """What the scripted server's final answer says the retry carried."""
    assert body["status"] == "completed", body
    return json.loads(body["result"]["content"][0]["text"])


def test_a_completed_call_with_an_unreadable_retry_after_header_completes(
    fate_hub: Hub, server: ScriptedServer
) -> None:
    server.script(with_header(done, b"retry-after", SUPERSCRIPT_TWO))
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    body = fate_hub.agent.wait(call_id, 30)
    assert body["status"] == "completed", body
    assert len(server.calls) == 1


# ---- an input request larger than the hub keeps, by its url or its other params ------------------------


def test_an_input_request_with_a_huge_url_or_params_is_unsupported_and_not_kept(
    fate_hub: Hub, server: ScriptedServer
) -> None:
    link = {
        "method": "elicitation/create",
        "params": {"mode": "url", "message": "Log in", "url": "https://login.example.com/" + "a" * 100_000},
    }
    padded = {"method": "elicitation/create", "params": {**FORM["params"], "_meta": {"pad": "p" * 100_000}}}
    server.script(asking({"link": link, "padded": padded, "ok": FORM}), done)
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    ok = fate_hub.reviewer.wait_for_request(call_id, "ok")
    rows = {ir.key: ir for ir in InputRequest.objects.filter(round__call_id=call_id)}
    for key in ("link", "padded"):
        row = rows[key]
        assert row.status == InputRequest.Status.UNSUPPORTED, key
        assert row.action == InputRequest.Action.DECLINE
        assert len(json.dumps(row.params)) < 1000 and len(row.url) < 1000, key
    assert "url" in rows["link"].problem and "params" in rows["padded"].problem
    assert fate_hub.reviewer.respond(ok["id"], "accept", {"name": "Ada"}).status_code == 200
    seen = _answered_text(fate_hub.agent.wait(call_id, 30))
    assert seen["responses"] == {
        "link": {"action": "decline"},
        "padded": {"action": "decline"},
        "ok": {"action": "accept", "content": {"name": "Ada"}},
    }
    assert seen["state"] == "state-1"


def test_an_input_request_of_ordinary_size_is_shown(fate_hub: Hub, server: ScriptedServer) -> None:
    link = {
        "method": "elicitation/create",
        "params": {"mode": "url", "message": "Log in", "url": "https://login.example.com/" + "a" * 2000},
    }
    tagged = {
        "method": "elicitation/create",
        "params": {**FORM["params"], "_meta": {"vendor/tag": "t" * 2000}},
    }
    server.script(asking({"link": link, "tagged": tagged}), done)
    call_id = fate_hub.agent.call("plain", {}, server="scripted")
    fate_hub.reviewer.wait_for_request(call_id, "link")
    fate_hub.reviewer.wait_for_request(call_id, "tagged")
