"""The only module that talks to the channel layer. Services call it from ``transaction.on_commit``.

Groups: ``call.<id>`` (long-polls and call pages waiting on one call) and ``team.<slug>`` /
``team._unrouted`` (reviewers' queues). Payloads are TypedDicts with a literal ``type``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from approvals.models import InputRequest, ToolCall

logger = logging.getLogger(__name__)

UNROUTED = "_unrouted"


class CallChanged(TypedDict):
    type: Literal["call.changed"]
    call: str
    status: str


class QueueChanged(TypedDict):
    type: Literal["queue.changed"]
    event: str  # round.opened | input.answered | round.closed
    call: str
    input_requests: list[str]


def call_group(call_id: object) -> str:
    return f"call.{call_id}"


def team_group(team_slug: str | None) -> str:
    return f"team.{team_slug or UNROUTED}"


def _send(group: str, message: CallChanged | QueueChanged) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, dict(message))
    except Exception:
        # A lost notice is recovered by the clients' resync; it must never undo the committed change.
        logger.exception("broadcast to %s failed", group)


def call_changed(call: ToolCall) -> None:
    _send(call_group(call.pk), CallChanged(type="call.changed", call=str(call.pk), status=call.status))


def queue_changed(event: str, call_id: object, input_requests: list[InputRequest]) -> None:
    teams = {ir.team.slug if ir.team else None for ir in input_requests}
    for team in teams:
        ids = [str(ir.pk) for ir in input_requests if (ir.team.slug if ir.team else None) == team]
        _send(
            team_group(team),
            QueueChanged(type="queue.changed", event=event, call=str(call_id), input_requests=ids),
        )


async def wait_until_final(call_id: object, seconds: float, load: Callable[[], Awaitable[ToolCall]]) -> None:
    """Return once the call is final or ``seconds`` have passed, woken by ``call.changed`` notices.

    The call is re-read every few seconds as well, so a notice lost in transit costs latency, not correctness.
    """
    layer = get_channel_layer()
    channel = await layer.new_channel()
    group = call_group(call_id)
    await layer.group_add(group, channel)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while True:
            if (await load()).is_final:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(layer.receive(channel), timeout=min(remaining, 5.0))
    finally:
        await layer.group_discard(group, channel)
