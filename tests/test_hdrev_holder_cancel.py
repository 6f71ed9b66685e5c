"""A held call whose server was answered ``cancel`` (its call ended: the agent cancelled it) gets
STOP_AFTER_CANCEL seconds for its tool to end on its own before the holder stops it. One cancel sends the
holder several notices (the round's, the call's): a notice arriving after the answer must not stop the tool
at once. In-process: the holder's notice handling."""

from __future__ import annotations

import asyncio

from approvals.holder import process
from approvals.holder.process import HolderProcess


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
