"""What the gateway answers to a body that is not one well-formed MCP message, in both eras alike: a batch
(no revision it speaks allows one) or a message that is not JSON-RPC 2.0 is -32600; a request whose params
are not an object -32602, with its id; a body over ELICIT_MAX_BODY the REST API's JSON 413. The handshake
era's transport alone answered the first ones -32602 with a dump of its parser's errors, and its limit a line
of plain text. Raw HTTP to the real gateway process, then the official SDK client to show sound requests
still pass."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.conf import settings

from tests import test_gateway as gateway_tests
from tests.test_gateway import GatewayHub, list_tools

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


def _post(ghub: GatewayHub, body: Any, headers: dict[str, str]) -> httpx.Response:
    sent = {
        "Authorization": f"Bearer {ghub.token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **headers,
    }
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(ghub.url + "/mcp", content=content, headers=sent, timeout=30)


def _legacy_session(ghub: GatewayHub) -> dict[str, str]:
    """The headers of a handshake-era session, opened with `initialize`."""
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
    answer = _post(ghub, init, headers)
    assert answer.status_code == 200, answer.text
    headers["Mcp-Session-Id"] = answer.headers["mcp-session-id"]
    assert _post(ghub, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers).status_code == 202
    return headers


def _modern(method: str) -> dict[str, str]:
    return {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}


def _error(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/json"
    found = answer.json()
    assert found["jsonrpc"] == "2.0"
    return found


def _invalid_requests(ping: dict[str, Any]) -> dict[str, Any]:
    return {
        "batch": [ping],
        "null id": {**ping, "id": None},
        "fractional id": {**ping, "id": 1.5},
        "boolean id": {**ping, "id": True},
        "object id": {**ping, "id": {"a": 1}},
        "no jsonrpc": {key: value for key, value in ping.items() if key != "jsonrpc"},
        "jsonrpc 1.0": {**ping, "jsonrpc": "1.0"},
        "not an object": "tools/list",
    }


def test_a_handshake_session_gets_invalid_request_for_a_batch_or_a_bad_id(ghub: GatewayHub) -> None:
    headers = _legacy_session(ghub)
    ping = {"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}}
    for what, body in _invalid_requests(ping).items():
        found = _error(_post(ghub, body, headers))
        assert found["id"] is None, what
        assert found["error"]["code"] == -32600, (what, found)
        message = found["error"]["message"]
        assert "pydantic" not in message and "validation error" not in message.lower(), (what, message)
        assert len(message) < 200, (what, message)
    # A client's error answer may have a null id (it could not read the request it answers): it passes.
    unreadable = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
    assert _post(ghub, unreadable, headers).status_code == 202
    # The session is still good for a sound request.
    answer = _post(ghub, ping, headers)
    assert answer.status_code == 200
    assert '"tools"' in answer.text


def test_a_handshake_session_gets_invalid_params_with_its_id_for_params_not_an_object(
    ghub: GatewayHub,
) -> None:
    headers = _legacy_session(ghub)
    for params in ([1], "x", 3):
        body = {"jsonrpc": "2.0", "id": "abc", "method": "tools/list", "params": params}
        found = _error(_post(ghub, body, headers))
        assert found["id"] == "abc"
        assert found["error"]["code"] == -32602
        assert "pydantic" not in found["error"]["message"]


def test_a_modern_request_gets_the_same_codes(ghub: GatewayHub) -> None:
    ping = {"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    for what, body in _invalid_requests(ping).items():
        found = _error(_post(ghub, body, _modern("tools/list")))
        assert found["error"]["code"] == -32600, (what, found)
    body = {"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": [ENVELOPE]}
    found = _error(_post(ghub, body, _modern("tools/list")))
    assert (found["id"], found["error"]["code"]) == (6, -32602)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_body_nested_past_the_parsers_depth_is_a_parse_error(ghub: GatewayHub, era: str) -> None:
    headers = _legacy_session(ghub) if era == "legacy" else _modern("tools/list")
    found = _error(_post(ghub, b"[" * 100_000, headers))
    assert found["error"]["code"] == -32700


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_body_over_the_limit_gets_the_apis_json_413(ghub: GatewayHub, era: str) -> None:
    headers = _legacy_session(ghub) if era == "legacy" else _modern("tools/list")
    limit = settings.ELICIT_MAX_BODY
    padding = "x" * (limit + 10)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE, "pad": padding}}
    answer = _post(ghub, body, headers)
    assert answer.status_code == 413
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("mode", ["legacy", MODERN])
def test_the_sdk_client_still_lists_the_tools(ghub: GatewayHub, mode: str) -> None:
    assert "demo__create_deployment" in list_tools(ghub.url + "/mcp", ghub.token, mode)
