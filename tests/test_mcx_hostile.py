"""The hub's MCP client against a hostile server: large events, answers cut off, errors without an id, an
unknown protocol version, requests other than elicitation mid-call; and rounds whose texts are not text.

The server (tests/mcx_hostile_server.py) is hand-written, speaks 2026-07-28 and the handshake era over
Streamable HTTP, and runs as a subprocess on a loopback port. The holder is ``manage.py run_holder`` in its
own process; relays go through the HTTP API.
"""

from __future__ import annotations

import logging
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from approvals.mcp_client import Completed, McpError, PermanentError, ServerConfig, call_tool, list_tools
from approvals.mcp_client.probe import MODERN_ONLY_HINT, probe
from approvals.mcp_client.session import Dispatcher, SessionHooks, call_on, http_transport, open_client
from approvals.models import AuditEvent, InputRequest, ToolCall
from tests import factories
from tests import test_mcprev_hostile_sessions as hostile_sessions
from tests.hub import Agent, Hub, set_up_handshake_hub
from tests.live import CountingServer, HolderRunner, wait_until
from tests.mcx_hostile_server import BIG_TEXT, DROPPED_NAME, DROPPED_PAGES, DROPPED_PER_PAGE

SCRIPT = Path(__file__).with_name("mcx_hostile_server.py")
RETRIES = hostile_sessions.RETRIES  # the holder's ELICIT_MCP_MAX_RETRIES here


class HostileServer(CountingServer):
    def __init__(self) -> None:
        super().__init__(SCRIPT, "the mcx hostile MCP test server")

    def at(self, version: str) -> str:
        """The server's URL where it answers initialize with `version`."""
        return f"http://127.0.0.1:{self.port}/v/{version}/mcp"


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    server = HostileServer()
    try:
        yield server
    finally:
        server.stop()


async def _never_asked(params: dict[str, Any]) -> dict[str, Any]:
    return {"action": "decline"}


def _modern(url: str, name: str) -> Any:
    """`call_tool` tool `name` (2026-07-28): its outcome, or the McpError it raised."""
    try:
        return anyio.run(call_tool, ServerConfig(url=url, timeout=5), name, {})
    except McpError as exc:
        return exc


def _held(url: str, name: str, *, limit: float = 20) -> Any:
    """`call_on` tool `name` on a new handshake-era session: its outcome, or the McpError it raised (on the
    call, or on the session the call ran on)."""

    async def main() -> Any:
        dispatcher = Dispatcher()
        transport, http = http_transport(
            ServerConfig(url=url, timeout=10), read_timeout=60, dispatcher=dispatcher
        )
        async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=10) as client:
            return await call_on(
                client, dispatcher, SessionHooks(elicit=_never_asked), name, {}, timeout=limit
            )

    try:
        return anyio.run(main)
    except McpError as exc:
        return exc


# ---- the client ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ["2026-07-28", "handshake"])
def test_a_result_in_an_sse_event_over_a_mebibyte_is_read(hostile: HostileServer, era: str) -> None:
    # Under the hub's bound on an answer (ELICIT_MAX_MCP_RESPONSE) a result is read in an event stream as in a
    # JSON answer; the SDK's own bound on an event (1 MiB) would lose it after the tool ran.
    outcome = _modern(hostile.url, "big_sse") if era == "2026-07-28" else _held(hostile.url, "big_sse")
    assert isinstance(outcome, Completed), outcome
    assert outcome.result["content"][0]["text"] == "a" * BIG_TEXT


def test_an_sse_event_past_the_response_bound_is_too_large_and_may_have_run(hostile: HostileServer) -> None:
    error = _modern(hostile.url, "endless_event")
    assert isinstance(error, PermanentError), error
    assert error.code == "response_too_large"
    assert "ELICIT_MAX_MCP_RESPONSE" in error.message
    assert error.may_have_run is True


def test_an_error_with_a_null_id_answers_the_call(hostile: HostileServer) -> None:
    # JSON-RPC's answer to a request whose id the server could not read: the call's answer, not something to
    # wait out (the call would end "timeout", its outcome unknown).
    error = _modern(hostile.url, "null_id_error")
    assert isinstance(error, PermanentError), error
    assert (error.code, error.rpc_code) == ("rpc_error", -32603)
    assert error.may_have_run is False


def test_an_answer_naming_another_id_is_malformed_at_once(hostile: HostileServer) -> None:
    # Not waited out to the call's time limit: it is the call's answer, and an answer the hub cannot use.
    error = _modern(hostile.url, "wrong_id")
    assert isinstance(error, PermanentError), error
    assert error.code == "malformed_response"
    assert error.may_have_run is True


def test_a_held_call_whose_answer_breaks_off_may_have_run(hostile: HostileServer) -> None:
    # The connection closes halfway through the answer: that ends the whole session, not just the call, and
    # the error says the call (not the session's opening) failed after the server took it.
    error = _held(hostile.url, "truncated")
    assert isinstance(error, McpError), error
    assert error.may_have_run is True
    assert "tools/call 'truncated'" in error.message
    assert "initialize" not in error.message


def test_sampling_and_roots_requests_mid_call_are_refused_and_the_call_goes_on(
    hostile: HostileServer,
) -> None:
    before = hostile.counts().get("answers", 0)
    outcome = _held(hostile.url, "ask_then_sample")
    assert isinstance(outcome, Completed), outcome
    assert outcome.result["content"][0]["text"] == "asked"
    assert hostile.counts()["answers"] == before + 2


@pytest.mark.parametrize("version", ["2099-01-01", "2026-07-28"])
def test_an_initialize_answered_with_a_version_the_hub_does_not_speak_is_protocol_unsupported(
    hostile: HostileServer, version: str
) -> None:
    error = _held(hostile.at(version), "big_sse")
    assert isinstance(error, PermanentError), error
    assert error.code == "protocol_unsupported"
    assert repr(version) in error.message and "2025-11-25" in error.message
    # Probed for the handshake era, the server is one the hub cannot use so: it says what to change (this one
    # speaks 2026-07-28 as well), not that the server is not understood.
    found = anyio.run(lambda: probe(ServerConfig(url=hostile.at(version), timeout=5), era="handshake"))
    assert found.ok is False
    assert found.error is not None and found.error["code"] == "protocol_unsupported"
    assert found.hint == MODERN_ONLY_HINT


def test_a_listing_of_tools_the_hub_must_drop_is_neither_kept_nor_logged_whole(
    hostile: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Page after page of tools with invalid x-mcp-header annotations, each named with a megabyte: the hub
    # holds one page at a time (not every name it dropped), and no log line quotes a whole name.
    server = ServerConfig(url=f"http://127.0.0.1:{hostile.port}/dropped/mcp", timeout=30)
    dropped = DROPPED_PAGES * DROPPED_PER_PAGE * DROPPED_NAME
    caplog.set_level(logging.WARNING)
    tracemalloc.start()
    try:
        tools = anyio.run(list_tools, server)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(tools) == []
    assert peak < dropped / 2
    assert caplog.records and all(len(record.getMessage()) <= 2000 for record in caplog.records)


# ---- through the holder --------------------------------------------------------------------------------


@pytest.fixture
def hub(live_db: None, hostile: HostileServer) -> Hub:
    return set_up_handshake_hub(hostile.url, slug="hostile")


holder = hostile_sessions.holder  # a quick holder, retrying at most RETRIES times


@pytest.mark.django_db(transaction=True)
def test_a_held_call_whose_answer_breaks_off_is_never_sent_again(
    hub: Hub, holder: HolderRunner, hostile: HostileServer
) -> None:
    before = hostile.counts().get("call:truncated", 0)
    call_id = hub.agent.call("truncated", {}, server="hostile")

    def ended() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    call: Any = wait_until(ended, 40, 0.2, what="the held call to end")
    assert call["status"] == "failed"
    assert call["error"]["code"] == "outcome_unknown"
    assert call["error"]["tool_may_have_run"] is True
    assert hostile.counts()["call:truncated"] == before + 1  # the tool is not idempotent: never sent again


# ---- rounds --------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"mode": "form", "message": ["x" * 1000] * 400, "requestedSchema": {"type": "object"}}, "message"),
        ({"mode": "url", "message": "Open it", "url": ["https://example.com/" + "x" * 1000] * 400}, "url"),
    ],
)
def test_an_input_request_whose_message_or_url_is_not_text_is_unsupported_and_not_kept(
    params: dict[str, Any], problem: str
) -> None:
    _, token = factories.agent("relay-bot")
    response = Agent(token).post(
        "/relays",
        {
            "server": "elsewhere",
            "tool": "deploy",
            "arguments": {},
            "input_requests": {"k": {"method": "elicitation/create", "params": params}},
        },
    )
    assert response.status_code == 201, response.content
    call = ToolCall.objects.get(pk=response.json()["id"])
    assert call.input_responses == {"k": {"action": "decline"}}
    ir = InputRequest.objects.get(round__call=call)
    assert (ir.status, ir.action) == (InputRequest.Status.UNSUPPORTED, InputRequest.Action.DECLINE)
    assert f"its {problem} is not text" in ir.problem
    assert len(ir.message) <= 100 and len(ir.url) <= 100
    assert ir.params == {"mode": params["mode"]}
    event = AuditEvent.objects.get(call_id=call.pk, verb="input.unsupported")
    assert len(event.data["message"]) <= 100
