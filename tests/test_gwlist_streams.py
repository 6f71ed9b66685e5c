"""The clients that the gateway keeps told of tool list changes cost it a bounded share, and none of them
outlives its agent's credential.

- A 2026-07-28 agent holds at most its share (ELICIT_GATEWAY_AGENT_SESSIONS) of `subscriptions/listen`
  streams; one it closes frees its place.
- The GET stream of a handshake-era session whose agent is deactivated is closed, so the session idles
  out. Before, the open GET stream kept the session from ever going idle: a revoked agent's session lived
  on, holding a place among ELICIT_GATEWAY_MAX_SESSIONS, and went on hearing what happened to the agent's
  tools."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest

from approvals import broadcast
from approvals.models import AgentClient, ToolCall
from tests import test_gateway as gateway_tests
from tests.live import child_env, wait_until
from tests.test_gateway import Gateway, GatewayHub, _pending_call, call_in_background
from tests.test_gwrev_sessions import _initialize

SHARE = 2

gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)

MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture(scope="module")
def gateway_process(django_db_setup: None) -> Iterator[Gateway]:
    process = Gateway(
        child_env(ELICIT_GATEWAY_AGENT_SESSIONS=str(SHARE), ELICIT_GATEWAY_PROGRESS_INTERVAL="1")
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _headers(token: str, **extra: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        **extra,
    }


class Stream:
    """A streamed response read on its own thread until the server ends it or the test closes it (which
    closes the connection, as a client that goes away does)."""

    def __init__(self, method: str, url: str, headers: dict[str, str], body: object = None) -> None:
        self.opened = threading.Event()
        self.ended = threading.Event()
        self.stop = threading.Event()
        self.status = 0
        self.text = ""

        async def read() -> None:
            async with (
                httpx.AsyncClient(timeout=httpx.Timeout(5, read=120)) as client,
                anyio.create_task_group() as group,
            ):

                async def stopper() -> None:
                    while not self.stop.is_set():
                        await anyio.sleep(0.05)
                    group.cancel_scope.cancel()

                group.start_soon(stopper)
                async with client.stream(method, url, headers=headers, json=body) as response:
                    self.status = response.status_code
                    self.opened.set()
                    async for chunk in response.aiter_text():
                        self.text += chunk
                group.cancel_scope.cancel()

        def run() -> None:
            try:
                anyio.run(read)
            except Exception as exc:  # a connection the server dropped: ended all the same
                self.text += f"\n[{type(exc).__name__}]"
            finally:
                self.opened.set()
                self.ended.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.opened.wait(20)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def _listen(ghub: GatewayHub, request_id: int) -> Stream:
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "subscriptions/listen",
        "params": {"_meta": META, "notifications": {"toolsListChanged": True}},
    }
    headers = _headers(ghub.token, **{"MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"})
    return Stream("POST", ghub.url + "/mcp", headers, body)


def _wait(predicate: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_an_agent_holds_its_share_of_listen_streams(ghub: GatewayHub) -> None:
    streams = [_listen(ghub, n) for n in range(SHARE)]
    try:
        for stream in streams:
            assert stream.status == 200
            assert _wait(lambda s=stream: "notifications/subscriptions/acknowledged" in s.text, 10)
            assert '"toolsListChanged":true' in stream.text
        refused = _listen(ghub, 99)
        assert refused.ended.wait(10)
        assert "too_many_streams" in refused.text
        refused.close()

        streams.pop().close()  # the client goes away: its place is free again (once the server sees it)
        deadline = time.monotonic() + 10
        while True:
            again = _listen(ghub, 100)
            streams.append(again)
            if (
                _wait(lambda a=again: "acknowledged" in a.text or a.ended.is_set(), 10)
                and not again.ended.is_set()
            ):
                break
            assert time.monotonic() < deadline, again.text
            streams.pop().close()
            time.sleep(0.2)
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.parametrize("initialized", [True, False])
def test_a_deactivated_agents_get_stream_is_closed(ghub: GatewayHub, initialized: bool) -> None:
    """With or without `notifications/initialized` (a client may open its GET stream and send nothing
    else)."""
    opened = _initialize(ghub.url, ghub.token)
    assert opened.status_code == 200, opened.text
    assert '"listChanged":true' in opened.text
    session = opened.headers["mcp-session-id"]
    headers = _headers(ghub.token, **{"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18"})
    if initialized:
        notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert httpx.post(ghub.url + "/mcp", json=notice, headers=headers, timeout=20).status_code == 202
    stream = Stream("GET", ghub.url + "/mcp", headers)
    try:
        assert stream.status == 200
        time.sleep(1)
        assert not stream.ended.is_set()

        AgentClient.objects.filter(pk=ghub.hub.server.agents.get().pk).update(is_active=False)
        broadcast.tools_changed()
        assert stream.ended.wait(10), "the revoked agent's GET stream is still open"
    finally:
        stream.close()


def test_a_revoked_agents_waiting_call_still_gets_its_error(ghub: GatewayHub) -> None:
    """Closing the revoked agent's GET stream leaves its waiting tools/call to end as documented: a JSON-RPC
    error saying why, not a dropped connection."""
    outcome, thread = call_in_background(
        ghub.url + "/mcp", ghub.token, "legacy", "demo__create_deployment", {"branch": "feature/gl"}
    )
    call_id = _pending_call(ghub.hub)
    wait_until(lambda: outcome.progress, 30, 0.1, what="the first progress notification")
    AgentClient.objects.filter(pk=ghub.hub.server.agents.get().pk).update(is_active=False)
    broadcast.tools_changed()
    thread.join(60)
    assert not thread.is_alive()
    assert outcome.result is None
    assert "deactivated or its token replaced" in repr(outcome.error)
    assert ToolCall.objects.get(pk=call_id).status not in ToolCall.Status.finals()  # it goes on on the hub
