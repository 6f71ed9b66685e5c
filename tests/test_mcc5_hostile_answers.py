"""The hub's MCP client against a server whose answers are its own but look like something else: a JSON-RPC
error with code -32000 (the SDK's code for a closed connection, and JSON-RPC's first "server error" code), an
answer on the call's SSE stream that names another request's id, and an answer carrying both a result and an
error.

The server is in-process (Starlette under uvicorn on a loopback port: `tests.live.LoopbackMcpServer`) and
speaks 2026-07-28 statelessly and the handshake era (``initialize``, ``Mcp-Session-Id``); what it answers a
``tools/call`` depends on the tool's name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from approvals.mcp_client import Completed, McpError, ServerConfig, call_tool, run
from approvals.mcp_client.session import Dispatcher, SessionHooks, call_on, http_transport, open_client
from tests.live import LoopbackMcpServer

pytestmark = pytest.mark.timeout(120)

SESSION = "mcc5-session"
TOKEN = "Bearer mcc5-secret-token-0123456789"
CRASH = "the tool's backend is down"


def _tool(name: str) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}}


def _message(rid: Any, *, result: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
    if error is not None:
        body["error"] = error
    else:
        body["result"] = result
    return json.dumps(body)


def _text(text: str) -> dict[str, Any]:
    return {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": False}


def _sse(*events: str) -> StreamingResponse:
    async def body() -> Any:
        for event in events:
            yield f"data: {event}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream")


class TwoEraServer(LoopbackMcpServer):
    what = "the mcc5 server"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def endpoint(self, request: Request) -> Response:
        if request.method == "DELETE":
            return Response(status_code=200)
        if request.method != "POST":
            return Response("no stream here", status_code=405, media_type="text/plain")
        body = json.loads(await request.body())
        rid, method = body.get("id"), body.get("method")
        if method == "initialize":
            init = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "mcc5", "version": "1"},
            }
            return JSONResponse(json.loads(_message(rid, result=init)), headers={"mcp-session-id": SESSION})
        if isinstance(method, str) and method.startswith("notifications/"):
            return Response(status_code=202)
        if method != "tools/call":
            return JSONResponse(
                json.loads(_message(rid, error={"code": -32601, "message": "no such method"}))
            )
        name = body["params"]["name"]
        self.calls.append(name)
        if name == "own_error_json":
            # An error of the server's own, quoting the credentials it was sent (as some echo a request).
            said = f"{CRASH} (asked with {request.headers.get('authorization')})"
            return JSONResponse(json.loads(_message(rid, error={"code": -32000, "message": said})))
        if name == "own_error_sse":
            return _sse(_message(rid, error={"code": -32000, "message": CRASH}))
        if name == "another_id":
            # Another request's result first, then this one's: the stream's first answer ends it.
            other = rid + 1 if isinstance(rid, int) else f"{rid}-other"
            return _sse(_message(other, result=_text("not yours")), _message(rid, result=_text("yours")))
        if name in ("both_json", "both_sse"):
            both = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": _text("ran"),
                    "error": {"code": -32603, "message": "no"},
                }
            )
            return Response(both, media_type="application/json") if name == "both_json" else _sse(both)
        if name == "null_id_error":
            return _sse(_message(None, error={"code": -32602, "message": "could not read the request"}))
        return _sse(_message(rid, result=_text("yours")))


@pytest.fixture(scope="module")
def server() -> Iterator[TwoEraServer]:
    with TwoEraServer() as running:
        yield running


def _config(server: TwoEraServer) -> ServerConfig:
    return ServerConfig(url=server.url, headers={"Authorization": TOKEN}, timeout=10.0)


def _modern(server: TwoEraServer, name: str) -> Any:
    """`call_tool` (2026-07-28, the stored definition: no tools/list): its outcome or its McpError."""
    try:
        return run(call_tool(_config(server), name, {}, tool=_tool(name), call_timeout=10))
    except McpError as exc:
        return exc


async def _decline(params: dict[str, Any]) -> dict[str, Any]:
    return {"action": "decline"}


def _held(server: TwoEraServer, name: str) -> Any:
    """`call_on` on a new handshake-era session: its outcome or its McpError."""

    async def main() -> Any:
        dispatcher = Dispatcher()
        transport, http = http_transport(_config(server), read_timeout=30, dispatcher=dispatcher)
        async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=10) as client:
            return await call_on(
                client, dispatcher, SessionHooks(elicit=_decline), name, {}, timeout=10, tool=_tool(name)
            )

    try:
        return anyio.run(main)
    except McpError as exc:
        return exc


ERAS = {"2026-07-28": _modern, "handshake": _held}


@pytest.mark.parametrize("era", list(ERAS))
@pytest.mark.parametrize("name", ["own_error_json", "own_error_sse"])
def test_a_servers_own_error_with_code_minus_32000_is_its_answer_not_a_lost_connection(
    server: TwoEraServer, era: str, name: str
) -> None:
    # The server answered the call with an error: the call failed, and the server said so. It is not a
    # connection that closed before the answer (a transient failure whose tool may have run).
    before = len(server.calls)
    error = ERAS[era](server, name)
    assert isinstance(error, McpError), error
    assert (error.code, error.rpc_code) == ("rpc_error", -32000), error
    assert not error.transient
    assert error.may_have_run is False
    assert CRASH in error.message
    assert "connection closed" not in error.message
    assert "mcc5-secret-token" not in error.message  # the server's echo of the credentials is scrubbed
    assert server.calls[before:] == [name]


@pytest.mark.parametrize("era", list(ERAS))
def test_an_sse_answer_naming_another_requests_id_is_malformed_not_taken_for_the_calls(
    server: TwoEraServer, era: str
) -> None:
    # Another request's result on the call's stream is not this call's result: the answer is unusable, and
    # the call reached the server, so the tool may have run.
    error = ERAS[era](server, "another_id")
    assert isinstance(error, McpError), error
    assert error.code == "malformed_response"
    assert error.may_have_run is True
    assert "not yours" not in error.message


@pytest.mark.parametrize("era", list(ERAS))
def test_an_sse_answer_naming_the_calls_id_or_none_is_still_the_calls(server: TwoEraServer, era: str) -> None:
    outcome = ERAS[era](server, "plain")
    assert isinstance(outcome, Completed), outcome
    assert outcome.result["content"][0]["text"] == "yours"
    error = ERAS[era](server, "null_id_error")  # JSON-RPC's answer when the server could not read the id
    assert isinstance(error, McpError), error
    assert (error.code, error.rpc_code, error.may_have_run) == ("rpc_error", -32602, False)


@pytest.mark.parametrize("era", list(ERAS))
@pytest.mark.parametrize("name", ["both_json", "both_sse"])
def test_an_answer_carrying_both_a_result_and_an_error_is_malformed_and_may_have_run(
    server: TwoEraServer, era: str, name: str
) -> None:
    # JSON-RPC allows one or the other. Read as the error, the call would count as refused (the tool did not
    # run) while the result says it ran: which one holds is unknown, so the outcome is.
    error = ERAS[era](server, name)
    assert isinstance(error, McpError), error
    assert error.code == "malformed_response"
    assert error.may_have_run is True
