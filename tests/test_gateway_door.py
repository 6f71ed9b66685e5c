"""What the gateway process (`manage.py run_gateway`, uvicorn) checks before the guard reads the token: a
request head over ``MAX_HEAD`` bytes is answered 431, as the API server does, and these refusals are JSON,
like the gateway's other errors.

Over a raw socket to the real gateway process, as ``test_body_limit_wire`` talks to the API server. With
uvicorn's own httptools protocol the endless header is collected in memory and nothing is answered.
"""

from __future__ import annotations

import json
import socket

import pytest

from elicit_hub.serve_api import MAX_HEAD
from tests import test_gateway as gateway_tests
from tests.test_body_limit_wire import WAIT, _answer, send_endless_head
from tests.test_gateway import Gateway

gateway_process = gateway_tests.gateway_process  # one gateway process, as the gateway tests run it

pytestmark = pytest.mark.timeout(60)


def _connect(gateway: Gateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT)
    sock.settimeout(WAIT)
    return sock


@pytest.mark.parametrize("path", ["/mcp", "/mcp/demo"])
def test_an_endless_request_head_is_refused_before_the_token_is_read(
    gateway_process: Gateway, path: str
) -> None:
    with _connect(gateway_process) as sock:
        send_endless_head(sock, f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer eha_")
        status, headers, body = _answer(sock)
    assert status == 431
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == "head_too_large"
    assert str(MAX_HEAD) in error["message"]


def test_a_request_that_is_not_http_gets_the_gateways_json_error(gateway_process: Gateway) -> None:
    with _connect(gateway_process) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nBroken header line\r\n\r\n")
        status, headers, body = _answer(sock)
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "bad_request"
