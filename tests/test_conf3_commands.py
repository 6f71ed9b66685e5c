"""`demo_agent` and `conformance_client` as a newcomer meets them: a wrong address, a hub that answers
something else, or a server that cannot be reached is one clear line and exit status 1, never a
traceback, and text the other side chose cannot drive the terminal."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import CommandError, call_command

from tests.live import free_port

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]


class _NotTheHub(BaseHTTPRequestHandler):
    """Answers every POST as the path says: /html/ with a 200 web page, /refuse/ with a JSON error whose
    message carries an escape sequence and a newline."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path.startswith("/html/"):
            status, kind, body = 200, "text/html", b"<html><body>Welcome to nginx!</body></html>"
        else:
            error = {"error": {"code": "unauthorized", "message": "bad token\x1b[2J\nforged line"}}
            status, kind, body = 401, "application/json", json.dumps(error).encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def other_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotTheHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def demo_agent_error(hub: str) -> str:
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("demo_agent", "--hub", hub, "--token", "not-a-real-token", stdout=out)
    assert failed.value.returncode == 1
    assert out.getvalue() == ""  # nothing was submitted
    return str(failed.value)


@pytest.mark.parametrize("hub", ["notaurl", "http://[::1", "http://", "ftp://127.0.0.1:8000"])
def test_demo_agent_refuses_a_hub_address_that_is_not_an_http_url(hub: str) -> None:
    message = demo_agent_error(hub)

    assert "--hub" in message and "is not an http(s) URL" in message


def test_demo_agent_says_what_answered_when_it_is_not_the_hub(other_server: str) -> None:
    message = demo_agent_error(other_server + "/html")

    assert message.startswith("create_deployment: the hub at ")
    assert "answered 200 (text/html)" in message
    assert "nginx" not in message


def test_demo_agent_shows_the_hubs_refusal_as_one_inert_line(other_server: str) -> None:
    message = demo_agent_error(other_server + "/refuse/")

    assert "401: unauthorized: bad token" in message
    assert "\x1b" not in message and "\n" not in message
    assert "\u27e8U+001B\u27e9" in message


def test_conformance_client_reports_an_unreachable_server_without_a_traceback() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    err = io.StringIO()

    with pytest.raises(CommandError) as failed:
        call_command("conformance_client", url, stdout=io.StringIO(), stderr=err)

    assert failed.value.returncode == 1
    assert str(failed.value).startswith(f"could not list the tools at {url}: connect_failed:")
