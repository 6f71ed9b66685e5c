"""The answers the web servers give at the door, before any middleware runs (413 for a body over the limit,
431 for an endless head, 400 for what is not HTTP), carry the security headers every other answer of the hub
carries: a Content-Security-Policy that allows nothing, nosniff, no framing, the referrer policy.

Over raw sockets, against Daphne (``elicit_hub.serve``) and the API server (``elicit_hub.serve_api``).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from elicit_hub.serve_api import MAX_HEAD
from tests.live import ApiServer, WebServer, child_env

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("live_db")]

WAIT = 10.0


@pytest.fixture(scope="module")
def api_process(django_db_setup: None) -> Iterator[ApiServer]:
    api = ApiServer(child_env()).start()
    try:
        yield api
    finally:
        api.stop()


def answer_to(server: WebServer, request: bytes) -> dict[str, str]:
    """The headers of the server's answer to `request` (it closes the connection after a refusal)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as sock:
        sock.settimeout(WAIT)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused part-way: answered
            sock.sendall(request)
        data = b""
        deadline = time.monotonic() + WAIT
        while b"\r\n\r\n" not in data and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert head[0], "no answer"
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:])}
    headers[":status"] = head[0].split()[1]
    return headers


def assert_guarded(headers: dict[str, str]) -> None:
    policy = headers.get("content-security-policy", "")
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy, headers
    assert headers.get("x-content-type-options") == "nosniff"
    assert headers.get("x-frame-options") == "DENY"
    assert headers.get("referrer-policy") == "same-origin"


TOO_LARGE = (
    b"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 999999999\r\n\r\n{"
)


@pytest.mark.parametrize("path", [b"/api/v1/calls", b"/requests/x/respond/"])
@pytest.mark.parametrize("which", ["daphne", "api"])
def test_a_refused_body_is_answered_with_the_security_headers(
    request: pytest.FixtureRequest, which: str, path: bytes
) -> None:
    server: WebServer = request.getfixturevalue("web_process" if which == "daphne" else "api_process")
    headers = answer_to(server, TOO_LARGE.replace(b"{path}", path))
    assert headers[":status"] == "413"
    assert_guarded(headers)


def test_an_endless_head_is_answered_with_the_security_headers(api_process: ApiServer) -> None:
    request = b"GET /api/v1/inbox HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * (2 * MAX_HEAD)
    headers = answer_to(api_process, request)
    assert headers[":status"] == "431"
    assert_guarded(headers)


def test_a_request_that_is_not_http_is_answered_with_the_security_headers(api_process: ApiServer) -> None:
    headers = answer_to(api_process, b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nBroken\r\n\r\n")
    assert headers[":status"] == "400"
    assert_guarded(headers)
