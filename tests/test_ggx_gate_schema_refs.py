"""A hostile server's inputSchema cannot make the hub fetch a URL: a ``$ref`` to the network, checked when a
reviewer edits a gate's arguments, resolves against nothing (no request leaves, past approvals.netguard or
not, and nothing waits on it); the edit is checked as against a broken schema. A ``$ref`` within the schema
still checks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from approvals.services.gate_checks import schema_errors


@pytest.fixture
def schema_host() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on the loopback that serves a strict schema and records every request it gets."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = json.dumps({"type": "integer"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("key", ["$ref", "$dynamicRef"])
def test_a_ref_to_the_network_is_never_fetched(schema_host, key: str) -> None:
    base, hits = schema_host
    schema = {"type": "object", "properties": {"bucket": {key: f"{base}/bucket.json"}}}
    assert schema_errors(schema, {"bucket": "tmp"}) == {}
    assert hits == []


def test_a_schema_whose_id_is_on_the_network_fetches_nothing_either(schema_host) -> None:
    base, hits = schema_host
    schema = {"$id": f"{base}/tool.json", "type": "object", "properties": {"bucket": {"$ref": "other.json"}}}
    assert schema_errors(schema, {"bucket": "tmp"}) == {}
    assert hits == []


def test_a_ref_within_the_schema_still_checks(schema_host) -> None:
    base, hits = schema_host
    schema = {
        "$id": f"{base}/tool.json",
        "type": "object",
        "$defs": {"name": {"type": "string"}},
        "properties": {"bucket": {"$ref": "#/$defs/name"}},
    }
    assert schema_errors(schema, {"bucket": 7}) == {"bucket": "7 is not of type 'string'"}
    assert hits == []
