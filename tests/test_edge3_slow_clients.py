"""Slow clients at the API server's door (``elicit_hub.serve_api``, uvicorn): a connection that sends nothing,
a request head sent a byte at a time, or a body that stops coming is closed after ELICIT_CLIENT_TIMEOUT
seconds (408 in the hub's shapes when a request was begun) instead of holding its connection for ever.

Over raw sockets against the real server, started with a two-second timeout.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from approvals.models import ToolCall
from tests.live import ApiServer, child_env

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("live_db")]

TIMEOUT = 2
WAIT = 15.0  # seconds the test waits for the server to give up: far longer than TIMEOUT


@pytest.fixture(scope="module")
def api(django_db_setup: None) -> Iterator[ApiServer]:
    server = ApiServer(child_env(ELICIT_CLIENT_TIMEOUT=str(TIMEOUT))).start()
    try:
        yield server
    finally:
        server.stop()


def connect(api: ApiServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=WAIT)
    sock.settimeout(WAIT)
    return sock


def until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """All the server wrote until it closed the connection, and how long that took; fails when it never
    closes within WAIT seconds."""
    started = time.monotonic()
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"the server kept the connection open {WAIT:g} s (answered {data[:200]!r})")
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - started


def parsed(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_a_connection_that_sends_nothing_is_closed(api: ApiServer) -> None:
    with connect(api) as sock:
        data, took = until_closed(sock)
    assert data == b""
    assert took < TIMEOUT + 5


@pytest.mark.parametrize(
    ("path", "kind"), [("/api/v1/inbox", "application/json"), ("/accounts/login/", "text/html")]
)
def test_a_head_that_never_ends_is_answered_408(api: ApiServer, path: str, kind: str) -> None:
    with connect(api) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        for _ in range(3 * TIMEOUT):  # a header a second: each byte used to keep the head waiting
            time.sleep(1)
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
        data, _ = until_closed(sock)
    status, headers, body = parsed(data)
    assert status == 408
    assert headers["connection"] == "close"
    assert headers["content-type"].startswith(kind)
    if kind == "application/json":
        assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_body_that_stops_coming_is_answered_408_and_nothing_is_stored(api: ApiServer) -> None:
    calls = ToolCall.objects.count()
    with connect(api) as sock:
        sock.sendall(
            b"POST /api/v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer nobody\r\nContent-Length: 1000\r\n\r\n{"
        )
        data, took = until_closed(sock)
    status, headers, body = parsed(data)
    assert status == 408
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert took < TIMEOUT + 5
    assert ToolCall.objects.count() == calls


def one_response(sock: socket.socket) -> int:
    """The status of the next whole response on a kept-alive connection (read to its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    status, headers, body = parsed(data)
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return status


def test_a_kept_alive_connection_serves_requests_sent_in_time(api: ApiServer) -> None:
    """The head's deadline is the connection's first request's: a later request on the same connection gets
    its own."""
    request = b"GET /api/v1/inbox HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with connect(api) as sock:
        for _ in range(3):
            sock.sendall(request)
            assert one_response(sock) == 401  # the application answered: no token
            time.sleep(TIMEOUT * 0.6)  # within uvicorn's keep-alive (5 s); together past one deadline


def test_the_gateway_answers_a_head_that_never_ends_408_in_json(django_db_setup: None) -> None:
    """The MCP gateway's server speaks the API server's protocol: the same deadline, its refusals JSON."""
    from tests.test_gateway import Gateway

    gateway = Gateway(child_env(ELICIT_CLIENT_TIMEOUT=str(TIMEOUT))).start()
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT) as sock:
            sock.settimeout(WAIT)
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            data, took = until_closed(sock)
    finally:
        gateway.stop()
    status, headers, body = parsed(data)
    assert headers["content-type"] == "application/json"
    assert status == 408
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert took < TIMEOUT + 5


def test_the_gateway_answers_a_body_that_stops_coming_408_in_json(django_db_setup: None) -> None:
    """Past the token: an agent's POST whose body stops coming is refused after the same deadline."""
    from tests import factories
    from tests.test_gateway import Gateway

    _, token = factories.agent("slow-bot")
    gateway = Gateway(child_env(ELICIT_CLIENT_TIMEOUT=str(TIMEOUT))).start()
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT) as sock:
            sock.settimeout(WAIT)
            sock.sendall(
                b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Accept: application/json, text/event-stream\r\n"
                + f"Authorization: Bearer {token}\r\n".encode()
                + b"Content-Length: 1000\r\n\r\n{"
            )
            data, took = until_closed(sock)
    finally:
        gateway.stop()
    status, headers, body = parsed(data)
    assert status == 408, data[:300]
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert took < TIMEOUT + 5
