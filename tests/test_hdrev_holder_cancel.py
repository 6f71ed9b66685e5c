"""A held call whose server was answered ``cancel`` (its call ended: the agent cancelled it) gets
STOP_AFTER_CANCEL seconds for its tool to end on its own before the holder stops it. One cancel sends the
holder several notices (the round's, the call's): a notice arriving after the answer must not stop the tool
at once; nor one that comes while the round is being opened. In-process: the holder's notice handling, and
its handling of a question with its database work replaced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from approvals.holder import process
from approvals.holder.process import HolderProcess
from approvals.mcp_client import ServerConfig
from approvals.services import holding


def test_a_notice_after_a_cancel_answer_leaves_the_tool_its_grace() -> None:
    call_id = "7d1f3c9e-0000-4000-8000-000000000001"

    async def main() -> list[float]:
        holder = HolderProcess(name="host:1:hdrev", max_calls=1, poll=1, heartbeat=1)
        checks: list[float] = []
        holder._check_ended = lambda call_id, *, after=0.0: checks.append(after)  # type: ignore[method-assign]
        tool = asyncio.create_task(asyncio.sleep(3600))  # the call's task: its tool still runs on the server
        holder.tasks[call_id] = tool
        # The server's question was answered cancel; then the cancel's other notices arrive.
        assert holder._answering(call_id, {"action": "cancel"}) == {"action": "cancel"}
        holder._notice(f"call:{call_id}")
        holder._notice(f"call:{call_id}")
        tool.cancel()
        return checks

    # Only the check once the grace has passed: none that would stop the tool now.
    assert asyncio.run(main()) == [process.STOP_AFTER_CANCEL]


def test_a_notice_for_a_call_running_its_tool_still_checks_at_once() -> None:
    call_id = "7d1f3c9e-0000-4000-8000-000000000002"

    async def main() -> list[float]:
        holder = HolderProcess(name="host:1:hdrev", max_calls=1, poll=1, heartbeat=1)
        checks: list[float] = []
        holder._check_ended = lambda call_id, *, after=0.0: checks.append(after)  # type: ignore[method-assign]
        tool = asyncio.create_task(asyncio.sleep(3600))
        holder.tasks[call_id] = tool
        holder._notice(f"call:{call_id}")  # the agent cancelled a call whose tool runs, no question open
        tool.cancel()
        return checks

    assert asyncio.run(main()) == [0.0]


def _held(call_id: str) -> holding.HeldCall:
    return holding.HeldCall(
        call_id=call_id,
        server_id=1,
        transport="http",
        mode="legacy",
        config=ServerConfig(url="https://tools.example.com/mcp"),
        tool="ask",
        arguments={},
        limit=60,
        elicitation_wait=60,
        idempotency_key="k",
    )


def _ask_while_cancelled(monkeypatch: pytest.MonkeyPatch, opened: holding.PushOpened) -> tuple[Any, bool]:
    """The server asks; while the holder opens its round (`opened`: what the hub makes of the question) the
    agent cancels the call and its notice reaches the holder. What the server is answered, and whether its
    tool was stopped at once (its task cancelled before its grace)."""
    call_id = "7d1f3c9e-0000-4000-8000-000000000003"
    holder = HolderProcess(name="host:1:hdrev", max_calls=1, poll=1, heartbeat=1)

    async def push_open(*, call_id: str, params: dict[str, Any]) -> holding.PushOpened:
        holder._notice(f"call:{call_id}")  # the cancel, noticed before the holder is back from the open
        await asyncio.sleep(0.05)  # the check it starts reads the call meanwhile: ended
        return opened

    async def push_answer(*, round_id: int) -> dict[str, Any]:
        assert round_id == opened.round_id
        return {"action": "cancel"}  # the round was closed by the cancel

    async def held_ended(*, call_id: str) -> bool:
        return True

    services: dict[Any, Any] = {
        holding.push_open: push_open,
        holding.push_answer: push_answer,
        holding.held_ended: held_ended,
    }
    monkeypatch.setattr(process, "db", lambda fn: services[fn])

    async def main() -> tuple[Any, bool]:
        tool = asyncio.create_task(asyncio.sleep(3600))  # the call's task: its tool runs on the server
        holder.tasks[call_id] = tool
        answer = await holder._elicit(process._Run(_held(call_id)), {"message": "Go?", "requestedSchema": {}})
        await asyncio.sleep(0.05)  # any check started meanwhile has run
        stopped = tool.cancelled() or tool.cancelling() > 0
        tool.cancel()
        for check in list(holder._checks):
            check.cancel()  # the grace checks, 5 s away
        return answer, stopped

    return asyncio.run(main())


def test_a_cancel_noticed_while_the_round_is_being_opened_leaves_the_tool_its_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reviewer sees the round once it is committed; the agent may cancel the call, and its notice reach
    the holder, before the holder is back from opening the round. The server is still answered ``cancel`` on
    the session and its tool given its grace, not stopped at once with its question left unanswered."""
    answer, stopped = _ask_while_cancelled(monkeypatch, holding.PushOpened(round_id=41, answer=None))
    assert answer == {"action": "cancel"}
    assert not stopped


def test_a_call_ended_while_a_question_is_refused_without_a_round_is_stopped_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No person was asked (the question was answered at once: the call has ended, its rounds ran out): a
    server asking again and again is stopped now, not given its grace question after question."""
    answer, stopped = _ask_while_cancelled(monkeypatch, holding.PushOpened(round_id=None, answer=None))
    assert answer == {"action": "cancel"}
    assert stopped
