"""What the probe tells an admin about a server that answers, but not as an MCP server at that address."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from approvals.mcp_client import ServerConfig, run
from approvals.mcp_client.probe import probe


@pytest.fixture
def redirecting() -> Iterator[str]:
    """A server that redirects every request to the same path with a slash (as a mounted app does)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(307)
            self.send_header("location", "/mcp/")
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_DELETE = do_POST

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.server_address[1]}/mcp"
    http.shutdown()
    http.server_close()


def test_a_redirecting_server_is_flagged_with_a_hint_to_register_where_it_redirects(redirecting: str) -> None:
    result = run(probe(ServerConfig(url=redirecting, timeout=10.0)))
    assert not result.ok and result.error is not None
    assert result.error["code"] == "redirect_not_followed" and redirecting + "/" in result.error["message"]
    assert (
        result.hint is not None
        and "redirect" in result.hint
        and "check that it is an MCP server" not in result.hint
    )
