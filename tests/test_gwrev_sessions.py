"""One agent cannot take every handshake-era session of the gateway: it holds at most its share
(ELICIT_GATEWAY_AGENT_SESSIONS, by default a tenth of ELICIT_GATEWAY_MAX_SESSIONS), and another agent's
client still opens its session. Before, a client that opens a session per task and never ends it (or one that
means harm) filled the process's limit and every other agent's handshake-era client got 503 until the
sessions expired. The real gateway process with a small limit, raw `initialize` requests, then the official
SDK client of another agent."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from approvals.services import tokens
from tests import test_gateway as gateway_tests
from tests.live import child_env
from tests.test_gateway import Gateway, GatewayHub, list_tools

MAX_SESSIONS = 20  # a share of 2 per agent

gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def gateway_process(django_db_setup: None) -> Iterator[Gateway]:
    process = Gateway(child_env(ELICIT_GATEWAY_MAX_SESSIONS=str(MAX_SESSIONS), ELICIT_NUM_PROXIES="1"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _initialize(url: str, token: str) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    return httpx.post(url + "/mcp", json=body, headers=headers, timeout=30)


def test_one_agent_cannot_take_every_session(ghub: GatewayHub) -> None:
    opened = 0
    refused = None
    for _ in range(MAX_SESSIONS + 1):
        answer = _initialize(ghub.url, ghub.token)
        if answer.status_code != 200:
            refused = answer
            break
        assert answer.headers.get("mcp-session-id")
        opened += 1
    assert refused is not None
    assert opened < MAX_SESSIONS  # it kept its share, not the whole process
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_sessions"

    # Another agent of the same server still gets a session, and its tools.
    _, other = tokens.agent_create(name="other agent", servers=[ghub.hub.server])
    answer = _initialize(ghub.url, other)
    assert answer.status_code == 200, answer.text
    assert "demo__create_deployment" in list_tools(ghub.url + "/mcp", other, "legacy")
    # A 2026-07-28 request of the first agent opens no session: it is still served.
    assert "demo__create_deployment" in list_tools(ghub.url + "/mcp", ghub.token, "2026-07-28")


def test_initialize_requests_at_once_still_open_at_most_the_share(ghub: GatewayHub) -> None:
    _, token = tokens.agent_create(name="eager agent", servers=[ghub.hub.server])
    answers: list[httpx.Response] = []

    def initialize() -> None:
        answers.append(_initialize(ghub.url, token))

    threads = [threading.Thread(target=initialize) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(answer.status_code for answer in answers)
    assert len(statuses) == 12
    assert set(statuses) <= {200, 429}
    assert 1 <= statuses.count(200) <= MAX_SESSIONS // 10
