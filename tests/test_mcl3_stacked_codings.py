"""An MCP server's answer in stacked content codings ("gzip, gzip") is decompressed within the answer's size
limit, as a single coding is: the HTTP client would otherwise undo them itself, with no bound (a "gzip bomb"
gzipped once more is a few kilobytes on the wire and any size once read). A coding the hub did not offer is
not read at all. The server is a real HTTP server on a loopback port answering every POST itself."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings

from approvals.mcp_client import McpError, ServerConfig, list_tools, run

LIMIT = 1024 * 1024
PADDING = 32 * LIMIT  # leading whitespace before the JSON answer: valid JSON, 32 times the limit once read


def _answer(request_id: object, padding: int) -> bytes:
    tool = {"name": "echo", "inputSchema": {"type": "object"}}
    tools = {"tools": [tool], "ttlMs": 0, "cacheScope": "private"}
    return b" " * padding + json.dumps({"jsonrpc": "2.0", "id": request_id, "result": tools}).encode()


def _encode(body: bytes, coding: str) -> bytes:
    for one in (item.strip() for item in coding.split(",")):
        if one == "gzip":
            body = gzip.compress(body, compresslevel=1)
        elif one == "deflate":
            body = zlib.compress(body, 1)
    return body


class _Handler(BaseHTTPRequestHandler):
    coding = "gzip, gzip"
    padding = PADDING

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in request:
            self.send_response(202)
            self.end_headers()
            return
        server = self.server
        body = _encode(_answer(request["id"], server.padding), server.coding)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", server.coding)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def packing_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _list(server: ThreadingHTTPServer, coding: str, padding: int) -> object:
    server.coding = coding  # type: ignore[attr-defined]
    server.padding = padding  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{server.server_address[1]}/mcp"
    try:
        return run(list_tools(ServerConfig(url=url, timeout=20.0)))
    except McpError as exc:
        return exc


@pytest.mark.parametrize("coding", ["gzip, gzip", "identity, gzip", "deflate, gzip"])
def test_stacked_codings_are_read_within_the_limit(
    packing_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch, coding: str
) -> None:
    monkeypatch.setattr(settings, "ELICIT_MAX_MCP_RESPONSE", LIMIT, raising=False)
    small = _list(packing_server, coding, 100)
    assert not isinstance(small, McpError), small
    assert [tool["name"] for tool in small] == ["echo"]  # type: ignore[attr-defined]
    bomb = _list(packing_server, coding, PADDING)
    assert isinstance(bomb, McpError), "an answer 32 times the limit once decompressed was read"
    assert bomb.code == "response_too_large", bomb


def test_a_coding_the_hub_did_not_offer_is_not_read(
    packing_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings, "ELICIT_MAX_MCP_RESPONSE", LIMIT, raising=False)
    error = _list(packing_server, "gzip, br", 100)
    assert isinstance(error, McpError), error
    assert error.code == "network_error" and "ecoding" in error.message
