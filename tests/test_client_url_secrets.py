"""A credential in a server's URL (``?api_key=...``) or a header HTTP cannot send, as the MCP client meets
them: never in an error message, a repr or a crash."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from approvals.mcp_client import PermanentError, ServerConfig, call_tool, run

KEY = "sk-live-51Habcdef"


class _EchoPath(BaseHTTPRequestHandler):
    """Refuses every request with a JSON-RPC error naming the path it was sent to (query included), as
    servers' errors often do."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        error = {"code": -32602, "message": f"bad key in {self.path}"}
        body = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "error": error}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoPath)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp?api_key={KEY}&region=eu"
    finally:
        server.shutdown()
        server.server_close()


def test_a_key_in_the_url_that_the_server_echoes_is_scrubbed_from_the_error(echo_url: str) -> None:
    with pytest.raises(PermanentError) as caught:
        run(call_tool(ServerConfig(url=echo_url), "echo", {}, tool={"name": "echo", "inputSchema": {}}))
    assert KEY not in caught.value.message and KEY not in str(caught.value)
    assert "bad key in /mcp?api_key=" in caught.value.message


def test_a_key_in_the_url_path_that_the_server_echoes_is_scrubbed_from_the_error(echo_url: str) -> None:
    path_key = "NjM1ZTVhNDEtYjQ4Zi00ZDVjLWI1N2Y"
    url = echo_url.replace("/mcp?", f"/s/{path_key}/mcp?")
    with pytest.raises(PermanentError) as caught:
        run(call_tool(ServerConfig(url=url), "echo", {}, tool={"name": "echo", "inputSchema": {}}))
    assert path_key not in caught.value.message and path_key not in str(caught.value)
    assert "bad key in /s/" in caught.value.message
    assert path_key not in repr(ServerConfig(url=url))


def test_a_server_config_repr_shows_its_url_without_its_key(echo_url: str) -> None:
    shown = repr(ServerConfig(url=echo_url))
    assert KEY not in shown and "/mcp?api_key=" in shown


def test_a_header_http_cannot_send_is_a_permanent_error_not_a_crash(echo_url: str) -> None:
    config = ServerConfig(url=echo_url, headers={"Authorization": "Bearer tøken"})
    with pytest.raises(PermanentError) as caught:
        run(call_tool(config, "echo", {}, tool={"name": "echo", "inputSchema": {}}))
    assert caught.value.code == "invalid_headers"
    assert caught.value.may_have_run is False
    assert "tøken" not in caught.value.message
