"""What the gateway answers a hostile or careless MCP client, in both eras: a tool name or a server slug
holding a character PostgreSQL cannot compare (NUL) is an unknown tool or server, not a server error; a
body sent with the wrong Content-Type or Accept, a 2026-07-28 GET or DELETE, and a client's response whose
result or error is malformed each get a JSON-RPC error (the transport's own answers were a line of plain
text, an empty body, or a dump of its parser's errors); a slug from the path is cut in the error that
repeats it. Raw HTTP to the real gateway process (PostgreSQL, Redis, the demo MCP server)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import anyio
import httpx
import httpx2
import mcp
import mcp_types as types
import pytest
from mcp.client.streamable_http import streamable_http_client

from approvals.models import McpServer, RoutingRule, ToolCall
from tests import test_gateway as gateway_tests
from tests.live import wait_until
from tests.test_gateway import Gateway, GatewayHub

gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)

MODERN = "2026-07-28"
LEGACY = "2025-06-18"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
SOUND = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _send(
    ghub: GatewayHub, body: Any, headers: dict[str, str], path: str = "/mcp", method: str = "POST"
) -> httpx.Response:
    sent = {"Authorization": f"Bearer {ghub.token}", **SOUND, **headers}
    content = None if body is None else json.dumps(body).encode()
    return httpx.request(method, ghub.url + path, content=content, headers=sent, timeout=30)


def _legacy_session(ghub: GatewayHub, path: str = "/mcp") -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {"MCP-Protocol-Version": LEGACY}
    answer = _send(ghub, init, headers, path)
    assert answer.status_code == 200, answer.text
    headers["Mcp-Session-Id"] = answer.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert _send(ghub, initialized, headers, path).status_code == 202
    return headers


def _event(answer: httpx.Response) -> dict[str, Any]:
    """The one JSON-RPC message of a handshake-era answer (an event stream, or JSON)."""
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("application/json"):
        return answer.json()
    data = [line[len("data: ") :] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert len(data) == 1, answer.text
    return json.loads(data[0])


def _json_error(answer: httpx.Response, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json", answer.text
    return answer.json()


def _header_name(name: str) -> str:
    return "=?base64?" + base64.b64encode(name.encode()).decode() + "?="


def test_a_tool_name_holding_a_nul_is_an_unknown_tool_in_both_eras(ghub: GatewayHub) -> None:
    for path, name in (("/mcp", "demo__ec\u0000ho"), ("/mcp/demo", "ec\u0000ho")):
        headers = _legacy_session(ghub, path)
        call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": name, "arguments": {}}}
        found = _event(_send(ghub, call, headers, path))
        assert found["id"] == 4
        assert found["error"]["code"] == -32602, found
        assert found["error"]["message"].startswith("Unknown tool"), found

        modern = {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": name, "arguments": {}, "_meta": ENVELOPE},
        }
        headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": _header_name(name)}
        found = _json_error(_send(ghub, modern, headers, path), 400)
        assert found["id"] == 5
        assert found["error"]["code"] == -32602, found
        assert found["error"]["message"].startswith("Unknown tool"), found
    # The sound name still calls nothing wrong: it is listed.
    listing = {"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    listed = _send(ghub, listing, {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}).json()
    assert "demo__echo" in [tool["name"] for tool in listed["result"]["tools"]]


@pytest.mark.parametrize("version", [LEGACY, MODERN])
def test_a_server_slug_holding_a_nul_is_an_unknown_server(ghub: GatewayHub, version: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    headers = {"MCP-Protocol-Version": version, "Mcp-Method": "tools/list"}
    for method in ("POST", "GET"):
        answer = _send(ghub, body if method == "POST" else None, headers, "/mcp/de%00mo", method)
        found = _json_error(answer, 404)
        assert found["error"]["code"] == "unknown_server", found


def test_an_unknown_server_s_long_slug_is_cut_in_the_error(ghub: GatewayHub) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
    found = _json_error(_send(ghub, body, headers, "/mcp/" + "s" * 5000), 404)
    assert found["error"]["code"] == "unknown_server"
    assert len(found["error"]["message"]) < 300, found
    assert "(5000 characters)" in found["error"]["message"]


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_body_not_sent_as_json_or_a_client_not_accepting_a_stream_gets_a_json_rpc_error(
    ghub: GatewayHub, era: str
) -> None:
    if era == "legacy":
        headers = _legacy_session(ghub)
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}}
    else:
        headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
        body = {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    for content_type in ("text/plain", "application/x-www-form-urlencoded", ""):
        found = _json_error(_send(ghub, body, {**headers, "Content-Type": content_type}), 400)
        assert found["jsonrpc"] == "2.0"
        assert found["id"] == 9
        assert found["error"]["code"] == -32600
        assert "Content-Type: application/json" in found["error"]["message"]
    for accept in ("application/json", "text/event-stream", "text/html"):
        found = _json_error(_send(ghub, body, {**headers, "Accept": accept}), 406)
        assert found["id"] == 9
        assert found["error"]["code"] == -32600
        assert "text/event-stream" in found["error"]["message"]
    # What the transport takes still passes: a media type with parameters, a wildcard Accept.
    for extra in ({"Content-Type": "application/json; charset=utf-8"}, {"Accept": "*/*"}):
        answer = _send(ghub, body, {**headers, **extra})
        assert answer.status_code == 200, answer.text
        assert '"demo__echo"' in answer.text


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_2026_get_or_delete_gets_a_json_rpc_405(ghub: GatewayHub, method: str) -> None:
    found = _json_error(_send(ghub, None, {"MCP-Protocol-Version": MODERN}, method=method), 405)
    assert found["error"]["code"] == -32600
    assert "POST" in found["error"]["message"]
    # A handshake-era session's DELETE still ends it.
    headers = _legacy_session(ghub)
    assert _send(ghub, None, headers, method="DELETE").status_code == 200
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    assert _send(ghub, listing, headers).status_code == 404


def test_a_client_response_with_a_malformed_result_or_error_is_invalid_request(ghub: GatewayHub) -> None:
    headers = _legacy_session(ghub)
    for body in (
        {"jsonrpc": "2.0", "id": 1, "result": 5},
        {"jsonrpc": "2.0", "id": 1, "result": ["a"]},
        {"jsonrpc": "2.0", "id": 1, "error": "boom"},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": "m"}},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": True, "message": "m"}},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -1}},
    ):
        found = _json_error(_send(ghub, body, headers), 400)
        assert found["error"]["code"] == -32600, (body, found)
        message = found["error"]["message"]
        assert "validation error" not in message.lower() and "input_value" not in message, (body, message)
    # A well-formed answer to a request the hub never sent is taken and dropped; the session goes on.
    for body in (
        {"jsonrpc": "2.0", "id": 1, "result": {}},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "no", "data": [1]}},
    ):
        assert _send(ghub, body, headers).status_code == 202, body
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    assert "demo__echo" in [tool["name"] for tool in _event(_send(ghub, listing, headers))["result"]["tools"]]


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_tools_call_or_list_params_of_the_wrong_type_say_which(ghub: GatewayHub, era: str) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("tools/call", {"name": 5, "arguments": {}}, "params.name to be a string"),
        ("tools/call", {"arguments": {}}, "params.name to be a string"),
        ("tools/call", {"name": "demo__echo", "arguments": [1]}, "params.arguments to be an object"),
        ("tools/call", {"name": "demo__echo", "arguments": "x"}, "params.arguments to be an object"),
        ("tools/call", {"name": "demo__echo", "inputResponses": [], "requestState": "s"}, "inputResponses"),
        ("tools/call", {"name": "demo__echo", "requestState": 7}, "params.requestState to be a string"),
        ("tools/list", {"cursor": 5}, "params.cursor to be a string"),
    ]
    headers = _legacy_session(ghub) if era == "legacy" else {"MCP-Protocol-Version": MODERN}
    for at, (method, params, said) in enumerate(cases):
        if era == "modern":
            params = {**params, "_meta": ENVELOPE}
            extra = {"Mcp-Method": method}
            if isinstance(params.get("name"), str):
                extra["Mcp-Name"] = params["name"]
        else:
            extra = {}
        body = {"jsonrpc": "2.0", "id": at, "method": method, "params": params}
        found = _json_error(_send(ghub, body, {**headers, **extra}), 400)
        assert found["id"] == at, (params, found)
        assert found["error"]["code"] == -32602, (params, found)
        assert said in found["error"]["message"], (params, found)
    # Nothing was called; null where a value may be left out is no value.
    assert not ToolCall.objects.exists()
    listing: dict[str, Any] = {"cursor": None}
    if era == "modern":
        listing["_meta"] = ENVELOPE
        headers = {**headers, "Mcp-Method": "tools/list"}
    body = {"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": listing}
    answer = _send(ghub, body, headers)
    assert answer.status_code == 200 and '"demo__echo"' in answer.text, answer.text


def test_a_client_refusing_a_pushed_question_cannot_forge_a_log_line(
    ghub: GatewayHub, gateway_process: Gateway
) -> None:
    team = ghub.hub.server.default_team
    assert team is not None
    RoutingRule.objects.create(
        name="the requester picks",
        server=McpServer.objects.get(slug="demo"),
        tool_pattern="create_deployment",
        team=team,
        answered_by=RoutingRule.AnsweredBy.REQUESTER,
    )
    # The log file outlives the process (appended to): this test's own marker, read from where it stood.
    marker = uuid.uuid4().hex
    forged = f"gateway: FORGED {marker} by the agent's client"
    start = len(gateway_process.log())

    async def person(context: Any, params: types.ElicitRequestParams) -> types.ErrorData:
        return types.ErrorData(code=-1, message=f"no thanks\n{forged}")

    async def run() -> types.CallToolResult:
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {ghub.token}"}, timeout=httpx2.Timeout(60)
        )
        transport = streamable_http_client(ghub.url + "/mcp", http_client=http)
        client = mcp.Client(transport, mode="legacy", elicitation_callback=person)
        async with http, client:
            return await client.call_tool("demo__create_deployment", {"branch": "forge"})

    result = anyio.run(run)
    assert result.is_error is True  # the refusal reached the upstream as a cancel

    def lines() -> list[str]:
        return gateway_process.log()[start:].splitlines()

    logged: list[str] = wait_until(  # type: ignore[assignment]
        lambda: [line for line in lines() if "refused the elicitation" in line and marker in line],
        30,
        0.1,
        what="the gateway's log line of the refusal",
    )
    assert len(logged) == 1, logged
    assert not any(line.startswith(forged) for line in lines())


def test_an_endpoint_with_a_trailing_slash_is_served_and_any_other_path_is_a_json_404(
    ghub: GatewayHub,
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
    for path, name in (("/mcp/", "demo__echo"), ("/mcp/demo/", "echo")):
        answer = _send(ghub, body, headers, path)
        assert answer.status_code == 200, (path, answer.status_code, answer.headers.get("location"))
        assert name in [tool["name"] for tool in answer.json()["result"]["tools"]], path
    # A session opened there works as on /mcp.
    session = _legacy_session(ghub, "/mcp/")
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    assert "demo__echo" in [
        t["name"] for t in _event(_send(ghub, listing, session, "/mcp/"))["result"]["tools"]
    ]
    # A slug the agent may not use is refused there as without the slash.
    assert _json_error(_send(ghub, body, headers, "/mcp/other/"), 404)["error"]["code"] == "unknown_server"
    for path in ("/mcp/demo/tools", "/elsewhere", "/mcp//demo"):
        found = _json_error(_send(ghub, body, headers, path), 404)
        assert found["error"]["code"] == "not_found", path
