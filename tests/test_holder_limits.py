"""What a handshake-era server may do to a held call: unstorable text, too many rounds, a progress flood, too
many inputs, and a failure nobody expected. Whatever it does, the call ends and the holder's work is bounded.

Real parts only: the server is an ``mcp`` 2.3 `MCPServer` (tests/unruly_push_server.py, Streamable HTTP with
sessions) whose tools use ``ctx.elicit()`` and -32042; the holder is ``manage.py run_holder`` in its own
process, on the test database; the agent uses the HTTP API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from approvals.models import AuditEvent, InputRequest, McpServer, Round, ToolCall
from approvals.services import sending
from tests.hub import Hub, set_up_hub
from tests.live import CountingServer, HolderRunner, child_env, wait_until

SCRIPT = Path(__file__).with_name("unruly_push_server.py")
MAX_INPUTS = 5  # ELICIT_MAX_INPUT_REQUESTS of the holder here: a -32042 naming more URLs is refused

pytestmark = pytest.mark.django_db(transaction=True)


class UnrulyServer(CountingServer):
    def __init__(self) -> None:
        super().__init__(SCRIPT, "the unruly test server")


@pytest.fixture(scope="module")
def unruly() -> Iterator[UnrulyServer]:
    server = UnrulyServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub(live_db: None, unruly: UnrulyServer) -> Hub:
    hub = set_up_hub(unruly.url, slug="unruly", honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(era=McpServer.Era.HANDSHAKE, elicitation_wait=30)
    hub.server.refresh_from_db()
    return hub


@pytest.fixture
def holder(live_db: None) -> Iterator[HolderRunner]:
    env = child_env(
        ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_MAX_INPUT_REQUESTS=str(MAX_INPUTS)
    )
    runner = HolderRunner(env).start()
    try:
        yield runner
    finally:
        runner.stop()


def _finished(hub: Hub, call_id: str, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(done, timeout, 0.1, what=f"call {call_id} to end")  # type: ignore[return-value]


def _text(call: dict[str, Any]) -> str:
    assert call["status"] == "completed", call
    return str(call["result"]["content"][0]["text"])


# ---- text the hub cannot store ------------------------------------------------------------------------


def test_a_url_refusal_holding_a_nul_is_declined_and_the_call_ends(hub: Hub, holder: HolderRunner) -> None:
    call_id = hub.agent.call("nul_auth", {}, server="unruly")
    call = _finished(hub, call_id)
    assert call["status"] == "failed", call
    assert call["error"]["code"] == "url_elicitation_required"
    assert "nul-1: decline" in call["error"]["message"]
    assert "\\u0000" not in json.dumps(call)
    ir = InputRequest.objects.get(round__call_id=call_id)
    assert (ir.status, ir.action) == (InputRequest.Status.UNSUPPORTED, InputRequest.Action.DECLINE)
    assert "NUL" in ir.problem
    assert ToolCall.objects.get(pk=call_id).holder_id is None


def test_a_question_holding_a_nul_is_declined_on_the_session(hub: Hub, holder: HolderRunner) -> None:
    call_id = hub.agent.call("nul_ask", {}, server="unruly")
    assert _text(_finished(hub, call_id)) == "decline"
    rnd = Round.objects.get(call_id=call_id)
    assert rnd.kind == Round.Kind.PUSH
    ir = rnd.input_requests.get()
    assert ir.status == InputRequest.Status.UNSUPPORTED
    assert "NUL" in ir.problem
    assert "\x00" not in ir.message
    assert "\\u0000" not in json.dumps(ir.params) + json.dumps(rnd.raw)
    assert hub.reviewer.inbox() == []


@pytest.fixture
def rounds_refused() -> Iterator[None]:
    """PostgreSQL refuses every new round: a failure the holder's code does not expect."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_refuse_round() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'no rounds today'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_refuse_round BEFORE INSERT ON approvals_round "
            "FOR EACH ROW EXECUTE FUNCTION test_refuse_round()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_refuse_round ON approvals_round")
            cursor.execute("DROP FUNCTION IF EXISTS test_refuse_round()")


def test_an_unexpected_failure_ends_the_held_call_outcome_unknown(
    hub: Hub, holder: HolderRunner, rounds_refused: None
) -> None:
    call_id = hub.agent.call("many_urls", {"n": 1}, server="unruly")
    call = _finished(hub, call_id)
    assert call["status"] == "failed", call
    assert call["error"]["code"] == "outcome_unknown"
    assert call["error"]["tool_may_have_run"] is True
    assert call["error"]["message"].startswith("The holder running this call failed (ProgrammingError)")
    assert ToolCall.objects.get(pk=call_id).holder_id is None


# ---- bounded work ---------------------------------------------------------------------------------------


def test_rounds_are_capped_as_on_2026_07_28(hub: Hub, holder: HolderRunner, unruly: UnrulyServer) -> None:
    asked = 300
    call_id = hub.agent.call("loop_ask", {"times": asked}, server="unruly")
    call = _finished(hub, call_id, timeout=120)
    assert call["status"] == "failed", call
    assert call["error"]["code"] == "too_many_rounds"
    assert call["error"]["message"] == (
        f"The server asked for input {sending.MAX_ROUNDS} times; the hub stopped."
    )
    assert call["error"]["tool_may_have_run"] is True
    assert Round.objects.filter(call_id=call_id).count() == sending.MAX_ROUNDS
    assert AuditEvent.objects.filter(call_id=call_id).count() < 5 * sending.MAX_ROUNDS
    # The question past the cap was answered, and the tool stopped: it did not go on asking.
    wait_until(lambda: unruly.counts().get("loop_ask.stopped"), 20, 0.1, what="the tool to be stopped")
    # Stopped soon after its cancel (the holder checks again STOP_AFTER_CANCEL seconds after any cancel it
    # gives): not left to ask on until its own end.
    assert unruly.counts()["loop_ask.asked"] < sending.MAX_ROUNDS + 25
    # The holder records the stop once its session has closed, which is also when the server sees the tool
    # stopped: the record may come a moment after the server's count.
    wait_until(
        lambda: AuditEvent.objects.filter(call_id=call_id, verb="call.stop_sent").exists(),
        20,
        0.1,
        what="the holder's record of the stop",
    )
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.FAILED


@pytest.fixture
def progress_writes() -> Iterator[Any]:
    """Every stored change of a call's progress, counted by PostgreSQL."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_progress_writes (call_id uuid, at timestamptz)")
        cursor.execute(
            "CREATE FUNCTION test_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO test_progress_writes VALUES (NEW.id, clock_timestamp()); RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_progress_write AFTER UPDATE OF progress ON approvals_toolcall FOR EACH ROW "
            "WHEN (NEW.progress IS DISTINCT FROM OLD.progress) EXECUTE FUNCTION test_progress_write()"
        )

    def writes(call_id: str) -> list[float]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM at) FROM test_progress_writes WHERE call_id = %s ORDER BY at",
                [call_id],
            )
            return [float(row[0]) for row in cursor.fetchall()]

    try:
        yield writes
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_progress_write ON approvals_toolcall")
            cursor.execute("DROP FUNCTION IF EXISTS test_progress_write()")
            cursor.execute("DROP TABLE IF EXISTS test_progress_writes")


def test_a_flood_of_final_progress_is_throttled_and_the_last_is_stored(
    hub: Hub, holder: HolderRunner, unruly: UnrulyServer, progress_writes: Any
) -> None:
    sent = 1000
    call_id = hub.agent.call("flood", {"n": sent}, server="unruly")
    assert _text(_finished(hub, call_id, timeout=60)) == f"flooded {sent}"
    progress = ToolCall.objects.get(pk=call_id).progress
    assert progress is not None
    assert (progress["progress"], progress["total"], progress["message"]) == (1, 1, f"tick {sent - 1}")
    writes = progress_writes(call_id)
    assert writes, "no progress stored"
    # At most 4 a second (as on 2026-07-28), and the last one besides.
    assert len(writes) <= 4 * (writes[-1] - writes[0]) + 2, len(writes)
    assert len(writes) < sent / 10


def test_a_url_refusal_naming_too_many_urls_makes_one_row(hub: Hub, holder: HolderRunner) -> None:
    urls = 3 * MAX_INPUTS
    call_id = hub.agent.call("many_urls", {"n": urls}, server="unruly")
    call = _finished(hub, call_id)
    assert call["status"] == "failed", call
    assert call["error"]["code"] == "url_elicitation_required"
    assert "decline" in call["error"]["message"]
    ir = InputRequest.objects.get(round__call_id=call_id)  # one row for the refused round, not one per URL
    assert ir.status == InputRequest.Status.UNSUPPORTED
    assert f"{urls} inputs in one round" in ir.problem and f"at most {MAX_INPUTS}" in ir.problem
    opened = AuditEvent.objects.get(call_id=call_id, verb="round.opened").data
    assert opened["key_count"] == urls and len(opened["keys"]) == MAX_INPUTS
