"""`server/discover` on the gateway names every protocol version it serves: 2026-07-28 and the handshake-era
versions its sessions negotiate (MCP's versioning: a dual-era server lists both). Before, it named 2026-07-28
only, the SDK's default, although the same endpoint answers an `initialize`. The real gateway process, a raw
`server/discover`, then the official SDK client in both eras on the versions discover named."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests import test_gateway as gateway_tests
from tests.test_gateway import GatewayHub, list_tools

gateway = gateway_tests.gateway
gateway_process = gateway_tests.gateway_process
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


def _headers(token: str, version: str, method: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": version,
        "Mcp-Method": method,
    }


def _discover(url: str, token: str) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "id": "d1",
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    answer = httpx.post(url, json=body, headers=_headers(token, "2026-07-28", "server/discover"), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


def _initialize(url: str, token: str, version: str) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = _headers(token, version, "initialize")
    del headers["MCP-Protocol-Version"], headers["Mcp-Method"]
    answer = httpx.post(url, json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    session = answer.headers["mcp-session-id"]
    httpx.delete(url, headers={**headers, "Mcp-Session-Id": session}, timeout=30)
    text = answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    return httpx.Response(200, content=text).json()["result"]


@pytest.mark.parametrize("path", ["/mcp", "/mcp/demo"])
def test_discover_names_the_handshake_versions_the_endpoint_also_serves(ghub: GatewayHub, path: str) -> None:
    url = ghub.url + path
    found = _discover(url, ghub.token)
    versions = found["supportedVersions"]
    assert versions[0] == "2026-07-28"  # newest first
    assert set(versions) == set(MODERN_PROTOCOL_VERSIONS) | set(HANDSHAKE_PROTOCOL_VERSIONS)
    assert len(versions) == len(set(versions))
    assert found["capabilities"]["tools"]["listChanged"] is True
    assert "ttlMs" in found and "cacheScope" in found
    # Each handshake-era version discover names is one an `initialize` is served in, as it asked.
    for version in versions:
        if version in HANDSHAKE_PROTOCOL_VERSIONS:
            assert _initialize(url, ghub.token, version)["protocolVersion"] == version


def test_the_sdk_client_still_picks_2026_07_28_after_discover(ghub: GatewayHub) -> None:
    # mode="auto" probes server/discover: a list holding handshake-era versions too keeps it on 2026-07-28.
    assert "demo__create_deployment" in list_tools(ghub.url + "/mcp", ghub.token, "auto")
    assert "demo__create_deployment" in list_tools(ghub.url + "/mcp", ghub.token, "legacy")


@pytest.mark.parametrize("method", ["tools/list", "server/discover"])
def test_an_unsupported_version_is_told_every_version_the_endpoint_serves(
    ghub: GatewayHub, method: str
) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": method,
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2027-01-01",
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    answer = httpx.post(ghub.url + "/mcp", json=body, headers=_headers(ghub.token, "2027-01-01", method))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert answer.json()["id"] == 7 and error["code"] == -32022
    assert error["data"]["requested"] == "2027-01-01"
    # The same list as server/discover: a client that also speaks a handshake-era version may initialize.
    assert error["data"]["supported"] == _discover(ghub.url + "/mcp", ghub.token)["supportedVersions"]
    assert set(HANDSHAKE_PROTOCOL_VERSIONS) <= set(error["data"]["supported"])
