"""A call's long-poll is woken by the call's notices on the real channel layer (Redis), and reads the call
only when a notice can end the wait: one that names a final status (or names none).

`broadcast.wait_until_final` is what ``GET /api/v1/calls/<id>?wait=N`` and the MCP gateway's wait run on.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction

from approvals import broadcast
from approvals.models import ToolCall
from approvals.services import calls
from tests import factories


def _move(call_id: object, status: str) -> None:
    ToolCall.objects.filter(pk=call_id).update(status=status)
    broadcast.call_changed(ToolCall.objects.only("id", "status").get(pk=call_id))


def _finish(call_id: object) -> None:
    with transaction.atomic():
        call = ToolCall.objects.select_related("server").get(pk=call_id)
        calls.call_finish(
            call=call, status=ToolCall.Status.COMPLETED, result={"content": [], "isError": False}
        )


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("live_db")
def test_a_long_poll_reads_the_call_only_for_a_notice_that_can_end_it() -> None:
    call = factories.call(factories.server("deploy"), status=ToolCall.Status.QUEUED)
    reads: list[str] = []

    async def load() -> ToolCall:
        row = await sync_to_async(ToolCall.objects.only("id", "status").get)(pk=call.pk)
        reads.append(row.status)
        return row

    async def scenario() -> float:
        waiting = asyncio.create_task(broadcast.wait_until_final(call.pk, 30, load))
        while not reads:  # the first read, before it waits
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the listener has joined the call's group
        for status in ("running", "awaiting_input", "resuming", "running"):
            await sync_to_async(_move)(call.pk, status)
        await asyncio.sleep(1.0)  # time for those four notices to arrive (and be passed over)
        assert not waiting.done()
        started = time.monotonic()
        await sync_to_async(_finish)(call.pk)
        await asyncio.wait_for(waiting, timeout=4)  # woken by the notice, well before the 5 s re-read
        return time.monotonic() - started

    took = asyncio.run(scenario())

    assert reads == ["queued", "completed"]
    assert took < 4


@pytest.mark.parametrize(
    ("message", "wakes"),
    [
        ({"type": "call.changed", "status": "running"}, False),
        ({"type": "call.changed", "status": "awaiting_input"}, False),
        ({"type": "call.changed", "status": "completed"}, True),
        ({"type": "call.changed", "status": "answered"}, True),
        ({"type": "call.changed"}, True),  # names no status: the wait reads the call to know
        ({"type": "queue.changed", "event": "round.opened"}, True),
    ],
)
def test_which_notices_wake_a_call_long_poll(message: dict[str, str], wakes: bool) -> None:
    assert broadcast._final_notice(message) is wakes
