"""What a server built on the TypeScript SDK answers a 2026-07-28 request, as the hub reports it.

Such servers route a request without an ``Mcp-Session-Id`` that is not ``initialize`` to an HTTP 400 JSON
error whose ``id`` is ``req.body.id``; with no JSON body parser in front (server-everything has none) that is
undefined, so the error has no ``id`` at all. The Python SDK cannot read it as JSON-RPC and puts its own words
in its place ("Server returned an error response", -32603): the hub reports the server's own error instead.
The server below is that routing on the pinned TypeScript SDK and Express (`.ci/interop.sh` installs them).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from approvals.mcp_client import McpError, PermanentError, ServerConfig, call_tool, discover, list_tools, run
from tests.interop.conftest import INTEROP, NODE, ThirdPartyServer, _start
from tests.live import ROOT, free_port

pytestmark = pytest.mark.timeout(300)

SDK = INTEROP / "node_modules" / "@modelcontextprotocol" / "sdk" / "dist" / "esm"
EXPRESS = INTEROP / "node_modules" / "express" / "index.js"

SERVER = """
import {{ randomUUID }} from "node:crypto";
import {{ createRequire }} from "node:module";
import {{ McpServer }} from "{sdk}/server/mcp.js";
import {{ StreamableHTTPServerTransport }} from "{sdk}/server/streamableHttp.js";
import {{ isInitializeRequest }} from "{sdk}/types.js";

const express = createRequire(import.meta.url)("{express}");
const app = express();
const transports = new Map();

app.post("/mcp", async (req, res) => {{
  const sessionId = req.headers["mcp-session-id"];
  if (sessionId && transports.has(sessionId)) {{
    await transports.get(sessionId).handleRequest(req, res);
  }} else if (!sessionId && isInitializeRequest(req.body)) {{
    const transport = new StreamableHTTPServerTransport({{
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => transports.set(id, transport),
    }});
    const server = new McpServer({{ name: "ts-routing", version: "1.0.0" }});
    await server.connect(transport);
    await transport.handleRequest(req, res, req.body);
  }} else {{
    res.status(400).json({{
      jsonrpc: "2.0",
      error: {{ code: {code}, message: "{message}" }},
      id: req?.body?.id,
    }});
  }}
}});
app.get("/mcp", (req, res) => res.status(405).end());
app.listen(Number(process.env.PORT), "127.0.0.1");
"""


def _server(tmp: Path, name: str, code: int, message: str) -> ThirdPartyServer:
    script = tmp / f"{name}.mjs"
    script.write_text(SERVER.format(sdk=SDK, express=EXPRESS, code=code, message=message))
    port = free_port()
    return _start(name, [str(NODE), str(script)], port)


@pytest.fixture(scope="module")
def ts_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ThirdPartyServer]]:
    if not (NODE.exists() and EXPRESS.exists()):
        result = subprocess.run(
            ["bash", str(ROOT / ".ci" / "interop.sh")], cwd=ROOT, capture_output=True, text=True, timeout=900
        )
        if result.returncode != 0:
            raise RuntimeError(f".ci/interop.sh failed:\n{result.stderr[-3000:]}")
    tmp = tmp_path_factory.mktemp("ts")
    servers = {
        "session": _server(tmp, "ts-session", -32000, "Bad Request: No valid session ID provided"),
        "other": _server(tmp, "ts-other", -32099, "Bad Request: tenant header missing"),
    }
    try:
        yield servers
    finally:
        for server in servers.values():
            server.process.stop()


def test_the_server_sends_an_http_400_error_without_an_id(ts_servers: dict[str, ThirdPartyServer]) -> None:
    answer = httpx.post(
        ts_servers["session"].url,
        json={"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}},
        headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28"},
    )
    assert answer.status_code == 400
    assert answer.json() == {
        "jsonrpc": "2.0",
        "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"},
    }


@pytest.mark.parametrize("operation", ["tools/list", "tools/call"])
def test_an_id_less_refusal_of_a_stateless_request_is_the_handshake_era(
    ts_servers: dict[str, ThirdPartyServer], operation: str
) -> None:
    config = ServerConfig(url=ts_servers["session"].url, timeout=10.0)
    with pytest.raises(PermanentError) as info:
        if operation == "tools/list":
            run(list_tools(config))
        else:
            run(call_tool(config, "echo", {"message": "hi"}))
    error = info.value
    assert error.code == "protocol_unsupported", error
    assert "No valid session ID provided" in error.message
    assert "set its era to handshake or auto" in error.message
    assert error.rpc_code == -32000 and not error.may_have_run


def test_discover_refused_without_an_id_is_protocol_unsupported(
    ts_servers: dict[str, ThirdPartyServer],
) -> None:
    with pytest.raises(PermanentError) as info:
        run(discover(ServerConfig(url=ts_servers["session"].url, timeout=10.0)))
    assert info.value.code == "protocol_unsupported"


def test_another_id_less_error_is_reported_in_the_servers_own_words(
    ts_servers: dict[str, ThirdPartyServer],
) -> None:
    with pytest.raises(McpError) as info:
        run(list_tools(ServerConfig(url=ts_servers["other"].url, timeout=10.0)))
    error = info.value
    assert error.code == "rpc_error" and not error.transient
    assert error.rpc_code == -32099
    assert "Bad Request: tenant header missing" in error.message
    assert "Server returned an error response" not in error.message
