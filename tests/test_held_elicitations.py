"""A held call's questions when the server or the agent stops waiting: the server cancels a question just as
its answer lands, the agent cancels the call while a question waits.

Real parts only: a stdio MCP server on the official SDK (`MCPServer`, ``mcp`` 2.3; its code below, run by the
holder as ``python -c``) whose tools use ``ctx.elicit()``; the holder is ``manage.py run_holder`` in its own
process, on the test database; the agent and the reviewer use the HTTP API. The server leaves marks (empty
files) in its working directory, which is its HOME, for the test to see what it did.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from approvals.models import AuditEvent, Holder, McpServer, Round, ToolCall
from approvals.services import holding
from elicit_hub import engines
from tests.hub import Hub, set_up_hub
from tests.live import HolderRunner, child_env, wait_until

SLUG = "held"
SERVER = """
import os
import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

mcp = MCPServer("held-test-server", version="1.0.0")


class Answer(BaseModel):
    text: str


def mark(name):
    open(os.path.join(os.environ["HOME"], name), "a").close()


@mcp.tool()
async def ask_again(ctx: Context, wait: float) -> str:
    '''Ask; past `wait` seconds, give up on that question (notifications/cancelled) and ask another.'''
    with anyio.move_on_after(wait):
        first = await ctx.elicit("First?", Answer)
        return "first " + first.action
    mark("gave-up")
    second = await ctx.elicit("Second?", Answer)
    return "second " + second.action + (" " + second.data.text if second.action == "accept" else "")


@mcp.tool()
async def ask_then_work(ctx: Context) -> str:
    '''Ask, then work for ten minutes whatever the answer.'''
    try:
        answer = await ctx.elicit("Go on?", Answer)
        mark("answered-" + answer.action)
        await anyio.sleep(600)
    except anyio.get_cancelled_exc_class():
        mark("stopped")
        raise
    return "worked"


@mcp.tool()
async def ask_many(ctx: Context, n: int) -> str:
    '''Ask `n` questions at once; mark when all but one have been cancelled.'''
    actions = {}

    async def one(i):
        result = await ctx.elicit(f"Question {i}?", Answer)
        actions[result.action] = actions.get(result.action, 0) + 1
        if actions.get("cancel") == n - 1:
            mark("cancelled-rest")

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return ", ".join(f"{action}: {count}" for action, count in sorted(actions.items()))


mcp.run("stdio")
"""

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stdio_dir() -> Iterator[Path]:
    root = engines.VAR_DIR / "test-stdio" / uuid.uuid4().hex
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def hub(live_db: None) -> Hub:
    hub = set_up_hub("http://127.0.0.1:9/mcp", slug=SLUG, honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(
        transport=McpServer.Transport.STDIO,
        url="",
        command=sys.executable,
        args=["-c", SERVER],
        era=McpServer.Era.HANDSHAKE,
        elicitation_wait=600,
    )
    return hub


@pytest.fixture
def holder(live_db: None, stdio_dir: Path) -> Iterator[HolderRunner]:
    env = child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_STDIO_DIR=str(stdio_dir))
    runner = HolderRunner(env, name="holder-held").start()
    try:
        yield runner
    finally:
        runner.stop()


def _marked(stdio_dir: Path, name: str) -> bool:
    return (stdio_dir / SLUG / name).exists()


def _finished(hub: Hub, call_id: str, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(done, timeout, 0.1, what=f"call {call_id} to end")  # type: ignore[return-value]


def _activity(condition: str) -> bool:
    """Whether a session on the test database matches `condition` (pg_stat_activity, read afresh)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # the view is read once per transaction otherwise
        cursor.execute(
            f"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND {condition}"  # noqa: S608
        )
        return bool(cursor.fetchone()[0])


def _lock_waiter() -> str | None:
    """Which of the holder's reads of a round waits for this test's lock: "gone" (`holding.push_gone`, which
    reads the round with its call's columns), "read" (`holding.push_answer`), or None."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # the view is read once per transaction otherwise
        cursor.execute(
            "SELECT query FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        queries = [row[0] for row in cursor.fetchall()]
    if any('"approvals_toolcall"."id"' in query for query in queries):
        return "gone"
    return "read" if queries else None


def _cancelled_as_answered(hub: Hub, stdio_dir: Path) -> tuple[str, str, Round]:
    """A question answered just as the server cancels it: the round is READY (answered) when the holder hears
    of the cancel. Returns the call, the question's id and its round."""
    for _ in range(3):
        (stdio_dir / SLUG / "gave-up").unlink(missing_ok=True)
        call_id = hub.agent.call("ask_again", {"wait": 3}, server=SLUG)
        first = hub.reviewer.wait_for_request(call_id, "elicitation")
        assert first["message"] == "First?"
        with transaction.atomic():
            # The round stays locked while the reviewer answers it: the holder cannot take the answer
            # before the server cancels the question, and its reaction to the cancel waits for this commit.
            rnd = Round.objects.select_for_update().get(call_id=call_id)
            assert hub.reviewer.respond(first["id"], "accept", {"text": "too late"}).status_code == 200
            wait_until(
                lambda: _marked(stdio_dir, "gave-up"), 30, 0.1, what="the server to cancel its question"
            )
            waiter = wait_until(_lock_waiter, 30, 0.1, what="the holder to see the cancel")
        if waiter == "gone":
            return call_id, first["id"], rnd
        # The holder's first read of the new round came after this test locked it: it takes the answer as
        # soon as the lock goes, before it hears of the cancel. Not the case under test: again.
        assert hub.agent.post(f"/calls/{call_id}/cancel", {}).status_code == 200
        _finished(hub, call_id)
    raise AssertionError("the holder read each new round only after the test had locked it")


def test_a_question_the_server_cancels_as_its_answer_lands_does_not_refuse_its_next_question(
    hub: Hub, holder: HolderRunner, stdio_dir: Path
) -> None:
    # Listening, the holder reads a waiting round again only every half minute: it hears of the answer
    # when this test commits, not before.
    wait_until(lambda: _activity("query LIKE 'LISTEN %'"), 30, 0.1, what="the holder to listen")
    call_id, first_id, rnd = _cancelled_as_answered(hub, stdio_dir)

    def second_question() -> dict[str, Any] | None:
        return next((i for i in hub.reviewer.inbox() if i["call"] == call_id and i["id"] != first_id), None)

    second: dict[str, Any] = wait_until(second_question, 30, 0.1, what="the second question")  # type: ignore[assignment]
    assert second["message"] == "Second?"
    assert hub.reviewer.respond(second["id"], "accept", {"text": "Ada"}).status_code == 200
    call = _finished(hub, call_id)
    assert call["status"] == "completed", call
    assert call["result"]["content"][0]["text"] == "second accept Ada"
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.CLOSED
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.COMPLETED


def test_an_agent_cancelling_while_a_question_waits_stops_the_tool_on_the_server(
    hub: Hub, holder: HolderRunner, stdio_dir: Path
) -> None:
    call_id = hub.agent.call("ask_then_work", {}, server=SLUG)
    hub.reviewer.wait_for_request(call_id, "elicitation")
    assert hub.agent.post(f"/calls/{call_id}/cancel", {}).status_code == 200
    # The tool does not go on for ten minutes, holding the server's one session from every other call.
    wait_until(lambda: _marked(stdio_dir, "stopped"), 30, 0.1, what="the server to stop the tool")
    stops = AuditEvent.objects.filter(call_id=call_id, verb="call.stop_sent")
    wait_until(stops.exists, 10, 0.1, what="the stop in the audit log")
    assert stops.get().data["status"] == "cancelled"
    call = ToolCall.objects.get(pk=call_id)
    assert (call.status, call.result) == (ToolCall.Status.CANCELLED, None)
    # The session is free again: the next call runs on it.
    again = hub.agent.call("ask_then_work", {}, server=SLUG)
    item = hub.reviewer.wait_for_request(again, "elicitation")
    assert item["message"] == "Go on?"


def test_a_server_asking_many_questions_at_once_gets_one_asked_and_the_rest_cancelled_cheaply(
    hub: Hub, holder: HolderRunner, stdio_dir: Path
) -> None:
    asked = 400
    before = len(holder.log())
    call_id = hub.agent.call("ask_many", {"n": asked}, server=SLUG)
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    # Answered once the others have their answers: a question asked after this answer would be asked.
    wait_until(lambda: _marked(stdio_dir, "cancelled-rest"), 30, 0.1, what="the other questions cancelled")
    assert hub.reviewer.respond(item["id"], "accept", {"text": "one"}).status_code == 200
    call = _finished(hub, call_id)
    assert call["status"] == "completed", call
    assert call["result"]["content"][0]["text"] == f"accept: 1, cancel: {asked - 1}"
    assert Round.objects.filter(call_id=call_id).count() == 1
    # Each refused question would cost the holder's one database thread a locked read and the log a line:
    # the holder's heartbeat waits behind them all, and a big enough burst has it declared lost.
    log = holder.log()[before:]
    refusals = log.count("a second elicitation while one waits") + log.count("while another waits for")
    assert refusals <= 10, refusals


QUESTION = {
    "mode": "form",
    "message": "Which branch?",
    "requestedSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}


def test_a_round_answered_but_not_delivered_when_the_server_stops_waiting_is_gone(hub: Hub) -> None:
    lost = Holder.objects.create(name="held-holder")
    call_id = hub.agent.call("ask_again", {"wait": 3}, server=SLUG)
    assert holding.holder_claim(holder_id=lost.pk, limit=1, stdio=True) == [call_id]
    opened = holding.push_open(call_id=call_id, params=QUESTION)
    assert opened.round_id is not None and opened.answer is None
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    assert hub.reviewer.respond(item["id"], "accept", {"text": "main"}).status_code == 200
    assert Round.objects.get(pk=opened.round_id).status == Round.Status.READY

    # The server cancelled its request before the holder gave it the answer.
    assert holding.push_gone(round_id=opened.round_id, why="the server stopped waiting", undelivered=True)
    rnd = Round.objects.get(pk=opened.round_id)
    assert (rnd.status, rnd.outcome) == (Round.Status.CLOSED, Round.Outcome.GONE)
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.RUNNING
    gone = AuditEvent.objects.get(call_id=call_id, verb="round.gone").data
    assert gone["why"] == "the server stopped waiting; the answer was not delivered"
    # Its next question is asked, not declined for a round nobody will ever take.
    again = holding.push_open(call_id=call_id, params={**QUESTION, "message": "Which tag?"})
    assert again.round_id is not None and again.answer is None
    assert hub.reviewer.wait_for_request(call_id, "elicitation")["message"] == "Which tag?"
