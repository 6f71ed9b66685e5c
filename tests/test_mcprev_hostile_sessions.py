"""Handshake-era sessions against a quirky server: what became of a call the server may have run.

The server (tests/mcprev_hostile_server.py) is hand-written MCP 2025-11-25 over Streamable HTTP, run as a
subprocess on a loopback port: SSE with comments, ``retry:`` and multi-line data; a stream that ends without
the answer; a 202 or an unreadable answer to ``tools/call``; a session that expires mid-call (HTTP 404 with
error -32001, as the TypeScript SDK answers). The holder is ``manage.py run_holder`` in its own process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.conf import settings

from approvals.mcp_client import Completed, McpError, PermanentError, ServerConfig, TransientError
from approvals.mcp_client.session import Dispatcher, SessionHooks, call_on, http_transport, open_client
from approvals.mcp_client.wire import HttpFacts, classify_rpc_error
from approvals.models import ToolCall
from tests.hub import Hub, set_up_handshake_hub
from tests.live import CountingServer, HolderRunner, child_env, wait_until

SCRIPT = Path(__file__).with_name("mcprev_hostile_server.py")
RETRIES = 2  # the holder's ELICIT_MCP_MAX_RETRIES here


class HostileServer(CountingServer):
    def __init__(self) -> None:
        super().__init__(SCRIPT, "the hostile MCP test server")


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    server = HostileServer()
    try:
        yield server
    finally:
        server.stop()


async def _never_asked(params: dict[str, Any]) -> dict[str, Any]:
    return {"action": "decline"}


def _call(url: str, name: str, *, elicit: Any = _never_asked, limit: float = 20) -> Any:
    """`call_on` tool `name` on a new handshake-era session: its outcome, or the McpError it raised."""

    async def main() -> Any:
        dispatcher = Dispatcher()
        transport, http = http_transport(
            ServerConfig(url=url, timeout=10), read_timeout=60, dispatcher=dispatcher
        )
        async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=10) as client:
            try:
                return await call_on(client, dispatcher, SessionHooks(elicit=elicit), name, {}, timeout=limit)
            except McpError as exc:
                return exc

    return anyio.run(main)


# ---- the session layer ---------------------------------------------------------------------------------


def test_sse_with_comments_retry_fields_and_data_over_several_lines_is_read(hostile: HostileServer) -> None:
    outcome = _call(hostile.url, "ok")
    assert isinstance(outcome, Completed), outcome
    assert outcome.result["content"][0]["text"] == "ok"


@pytest.mark.parametrize("tool", ["vanish", "accepted", "broken"])
def test_a_call_whose_answer_is_lost_after_the_server_took_it_may_have_run(
    hostile: HostileServer, tool: str
) -> None:
    # A stream that ends without the answer, a 202, an answer that is not JSON-RPC: the server had the call.
    before = hostile.counts().get(f"call:{tool}", 0)
    error = _call(hostile.url, tool)
    assert isinstance(error, McpError), error
    assert error.may_have_run is True
    assert "the tool may have run" in error.message
    assert hostile.counts()[f"call:{tool}"] == before + 1


def test_a_stream_ending_while_a_question_was_answered_leaves_the_outcome_open(
    hostile: HostileServer,
) -> None:
    asked: list[dict[str, Any]] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"action": "accept", "content": {"go": True}}

    error = _call(hostile.url, "ask_vanish", elicit=elicit)
    assert [params["message"] for params in asked] == ["Go?"]
    assert isinstance(error, TransientError) and error.code == "network_error"
    assert error.may_have_run is True


def test_an_expired_session_is_a_refusal_at_once_not_a_time_out(hostile: HostileServer) -> None:
    # HTTP 404 with -32001 "Session not found": the server refused the call unread, at once; -32001 is not
    # the hub's own time-out, and the call did not wait for its limit.
    started = time.monotonic()
    error = _call(hostile.url, "expire", limit=20)
    assert isinstance(error, TransientError), error
    assert error.code == "session_expired"
    assert error.may_have_run is False
    assert "HTTP 404" in error.message and "Session not found" in error.message
    assert time.monotonic() - started < 15


def test_a_400_naming_the_session_without_an_id_is_an_expired_session(hostile: HostileServer) -> None:
    # server-everything's answer: HTTP 400, an error without an id (the SDK cannot read it as JSON-RPC and
    # says only "Server returned an error response"); the hub reads the server's own words.
    before = hostile.counts().get("call:expire_400", 0)
    error = _call(hostile.url, "expire_400")
    assert isinstance(error, TransientError), error
    assert error.code == "session_expired"
    assert error.may_have_run is False
    assert "HTTP 400" in error.message and "No valid session ID provided" in error.message
    assert hostile.counts()["call:expire_400"] == before + 1


def test_a_404_naming_the_session_is_classified_as_expired_whatever_its_code() -> None:
    ts_sdk = classify_rpc_error(-32001, "Session not found", None, HttpFacts(404, "application/json"))
    assert (ts_sdk.code, ts_sdk.transient) == ("session_expired", True)
    plain = classify_rpc_error(-32600, "Session terminated", None, HttpFacts(404, "text/plain"))
    assert plain.code == "session_expired"
    # -32001 in a successful answer (or the SDK's own) is still a time-out.
    assert classify_rpc_error(-32001, "Request timed out", None, HttpFacts(200, "application/json")).code == (
        "timeout"
    )
    # A 400 naming the session, on a session: expired; without one (a stateless 2026-07-28 request): not.
    refusal = "Bad Request: No valid session ID provided"
    facts = HttpFacts(400, "application/json", session=True, said=refusal)
    assert (
        classify_rpc_error(-32603, "Server returned an error response", None, facts).code == "session_expired"
    )
    # mcp 1.x says so in an error the SDK can read: on a session, it is no call for the handshake era.
    readable = HttpFacts(400, "application/json", session=True)
    assert classify_rpc_error(-32600, refusal, None, readable).code == "session_expired"
    stateless = HttpFacts(400, "application/json", said=refusal)
    assert classify_rpc_error(-32603, "Server returned an error response", None, stateless).code != (
        "session_expired"
    )
    # A 404 that names no session is no expiry.
    assert classify_rpc_error(-32601, "Not Found", None, HttpFacts(404, "text/plain")).code == "http_4xx"


@pytest.mark.parametrize("tool", ["gzipped", "deflated"])
def test_a_compressed_answer_is_read(hostile: HostileServer, tool: str) -> None:
    outcome = _call(hostile.url, tool)
    assert isinstance(outcome, Completed), outcome
    assert outcome.result["content"][0]["text"] == "packed"


def test_a_compressed_answer_larger_than_the_limit_once_decompressed_is_not_read(
    hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Well under a megabyte on the wire, 64 MiB once decompressed: the limit counts what the hub would read.
    monkeypatch.setattr(settings, "ELICIT_MAX_MCP_RESPONSE", 1024 * 1024, raising=False)
    error = _call(hostile.url, "bomb")
    assert isinstance(error, PermanentError), error
    assert error.code == "response_too_large"
    assert error.may_have_run is True


# ---- through the holder --------------------------------------------------------------------------------


@pytest.fixture
def hub(live_db: None, hostile: HostileServer) -> Hub:
    return set_up_handshake_hub(hostile.url, slug="quirky")


@pytest.fixture
def holder(live_db: None) -> Iterator[HolderRunner]:
    runner = HolderRunner(
        child_env(
            ELICIT_HOLDER_POLL="1",
            ELICIT_HOLDER_HEARTBEAT="1",
            ELICIT_MCP_RETRY_BASE="1",
            ELICIT_MCP_RETRY_MAX="1",
            ELICIT_MCP_MAX_RETRIES=str(RETRIES),
        )
    ).start()
    try:
        yield runner
    finally:
        runner.stop()


def _ended(hub: Hub, call_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(done, 40, 0.2, what="the held call to end")  # type: ignore[return-value]


@pytest.mark.django_db(transaction=True)
def test_a_held_call_whose_stream_ends_without_its_answer_ends_outcome_unknown(
    hub: Hub, holder: HolderRunner, hostile: HostileServer
) -> None:
    before = hostile.counts().get("call:vanish", 0)
    call_id = hub.agent.call("vanish", {}, server="quirky")
    call = _ended(hub, call_id)
    assert call["status"] == "failed"
    assert call["error"]["code"] == "outcome_unknown"
    assert call["error"]["tool_may_have_run"] is True
    assert "SSE stream ended without a response" in call["error"]["message"]
    assert "does not send it again" in call["error"]["message"]
    assert hostile.counts()["call:vanish"] == before + 1  # never sent again
    assert ToolCall.objects.get(pk=call_id).holder is None


@pytest.mark.django_db(transaction=True)
def test_a_held_call_refused_by_an_expired_session_is_sent_again_on_a_new_one(
    hub: Hub, holder: HolderRunner, hostile: HostileServer
) -> None:
    # The 404 proves the server did not run it: the holder opens a new session and sends it there, once.
    call_id = hub.agent.call("expire_once", {}, server="quirky")
    call = _ended(hub, call_id)
    assert call["status"] == "completed", call
    assert call["result"]["content"][0]["text"] == "ran"
    counts = hostile.counts()
    assert counts["call:expire_once"] == 2
    assert counts["ran:expire_once"] == 1
    assert counts["method:initialize"] >= 2


@pytest.mark.django_db(transaction=True)
def test_a_session_that_keeps_expiring_fails_the_call_without_running_it(
    hub: Hub, holder: HolderRunner, hostile: HostileServer
) -> None:
    before = hostile.counts().get("call:expire", 0)
    call_id = hub.agent.call("expire", {}, server="quirky")
    call = _ended(hub, call_id)
    assert call["status"] == "failed"
    assert call["error"]["code"] == "session_expired"
    # Tried again on new sessions as often as a failing server is, then given up; it never ran.
    assert hostile.counts()["call:expire"] - before == 1 + RETRIES
