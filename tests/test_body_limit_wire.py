"""A body over ELICIT_MAX_BODY is refused by the web server as it arrives, not after it was all stored.

Against both real servers of the hub's HTTP application, Daphne (``elicit_hub.serve``) and the API server
(uvicorn, ``elicit_hub.serve_api``), over a raw socket so the test controls what is sent and when. Daphne
alone collects a whole body before the application sees the request, and Django's handler reads one whole
(spooling it to disk) before its middleware runs: without the door's checks these tests fail, since the
server waits for bytes the client never sends and answers nothing.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
from django.conf import settings

from approvals.models import ToolCall
from elicit_hub.serve_api import MAX_HEAD
from tests.live import ApiServer, WebServer, child_env

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("live_db")]


@pytest.fixture(scope="module")
def api_process(django_db_setup: None) -> Iterator[ApiServer]:
    api = ApiServer(child_env()).start()
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture(params=["daphne", "api"])
def web(request: pytest.FixtureRequest, live_db: None) -> WebServer:
    """Each test runs against Daphne (the suite's web process) and against the API server."""
    server: WebServer = request.getfixturevalue("web_process" if request.param == "daphne" else "api_process")
    return server


WAIT = 10.0  # seconds the test waits for an answer: far longer than a refusal takes


def _connect(web: WebServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=WAIT)
    sock.settimeout(WAIT)
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The whole answer, read until the server closes the connection (a refusal closes it)."""
    data = b""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head, "no answer: the server waited for the rest of the body"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


def send_endless_head(sock: socket.socket, start: str) -> None:
    """`start` (a request line and headers, the last one left open), then that header's value without end:
    until the server stops reading (four times ``MAX_HEAD`` at most)."""
    sock.sendall(start.encode())
    sent = 0
    try:
        while sent <= 4 * MAX_HEAD:
            sock.sendall(b"a" * 8192)
            sent += 8192
    except (BrokenPipeError, ConnectionResetError):
        pass


def _head(method: str, path: str, extra: str) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer nobody\r\n{extra}\r\n"
    ).encode()


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(web: WebServer) -> None:
    calls = ToolCall.objects.count()
    with _connect(web) as sock:
        # 50 MB announced, 1 KB sent: the answer comes at once, from the headers alone.
        sock.sendall(_head("POST", "/api/v1/calls", f"Content-Length: {50 * 1024 * 1024}\r\n"))
        sock.sendall(b"{" + b" " * 1023)
        status, headers, body = _answer(sock)
    assert status == 413
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "body_too_large"
    assert str(settings.ELICIT_MAX_BODY) in error["message"]
    assert ToolCall.objects.count() == calls


def test_a_client_that_asks_before_sending_is_told_no_and_never_to_continue(web: WebServer) -> None:
    with _connect(web) as sock:
        sock.sendall(
            _head("POST", "/api/v1/calls", f"Content-Length: {50 * 1024 * 1024}\r\nExpect: 100-continue\r\n")
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in data


def test_a_chunked_body_is_refused_once_it_passes_the_limit(web: WebServer) -> None:
    chunk = b"x" * 65536
    with _connect(web) as sock:
        sock.sendall(_head("POST", "/api/v1/calls", "Transfer-Encoding: chunked\r\n"))
        sent = 0
        try:
            while sent <= settings.ELICIT_MAX_BODY + len(chunk):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending: the answer is already waiting
        # The last chunk (the body's end) is never sent: an answer can only come from the limit.
        status, headers, body = _answer(sock)
    assert status == 413
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "body_too_large"


def test_a_page_gets_a_readable_refusal(web: WebServer) -> None:
    with _connect(web) as sock:
        sock.sendall(
            b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 104857600\r\n\r\n"
        )
        status, headers, body = _answer(sock)
    assert status == 413
    assert headers["content-type"].startswith("text/html")
    assert b"Too much to send" in body


def test_a_body_within_the_limit_still_reaches_the_application(web: WebServer) -> None:
    body = json.dumps({"server": "x", "tool": "t", "arguments": {"pad": "y" * 4096}}).encode()
    with _connect(web) as sock:
        sock.sendall(
            _head("POST", "/api/v1/calls", f"Content-Length: {len(body)}\r\nConnection: close\r\n") + body
        )
        status, _, answer = _answer(sock)
    assert status == 401  # the application answered: the token is unknown
    assert json.loads(answer)["error"]["code"]


@pytest.mark.parametrize(
    ("path", "kind"), [("/api/v1/inbox", "application/json"), ("/accounts/login/", "text/html")]
)
def test_an_endless_request_head_is_refused_by_the_api_server(
    api_process: ApiServer, path: str, kind: str
) -> None:
    """httptools sets no limit on a header: the API server stops reading once the head passes MAX_HEAD."""
    with _connect(api_process) as sock:
        send_endless_head(sock, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ")
        status, headers, body = _answer(sock)
    assert status == 431
    assert headers["connection"] == "close"
    assert headers["content-type"].startswith(kind)
    assert str(MAX_HEAD).encode() in body
    if kind == "application/json":
        assert json.loads(body)["error"]["code"] == "head_too_large"


def test_a_request_that_is_not_http_gets_the_api_s_json_error_from_the_api_server(
    api_process: ApiServer,
) -> None:
    with _connect(api_process) as sock:
        sock.sendall(b"GET /api/v1/inbox HTTP/1.1\r\nHost: 127.0.0.1\r\nBroken header line\r\n\r\n")
        status, headers, body = _answer(sock)
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "bad_request"


def test_a_large_head_within_the_limit_is_served_by_the_api_server(api_process: ApiServer) -> None:
    padding = "a" * (MAX_HEAD // 2)
    with _connect(api_process) as sock:
        sock.sendall(
            f"GET /api/v1/inbox HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: {padding}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        status, _, body = _answer(sock)
    assert status == 401  # the application answered: no token
    assert json.loads(body)["error"]["code"]
