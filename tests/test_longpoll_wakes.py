"""A call's long-poll is woken by the call's notices on the real channel layer (Redis), and reads the call
only when a notice can end the wait: one that names a final status (or names none).

`broadcast.wait_until_final` is what ``GET /api/v1/calls/<id>?wait=N`` and the MCP gateway's wait run on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.test import override_settings

from approvals import broadcast
from approvals.models import InputRequest, ToolCall
from tests import factories
from tests.live import unreachable_redis_url


def _move(call_id: object, status: str) -> None:
    ToolCall.objects.filter(pk=call_id).update(status=status)
    broadcast.call_changed(ToolCall.objects.only("id", "status").get(pk=call_id))


def _status_reads(call_id: object) -> tuple[list[str], Callable[[], Awaitable[ToolCall]]]:
    """A long-poll's check of the call's status, and the list of the statuses it read."""
    reads: list[str] = []

    async def load() -> ToolCall:
        row = await sync_to_async(ToolCall.objects.only("id", "status").get)(pk=call_id)
        reads.append(row.status)
        return row

    return reads, load


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("live_db")
def test_a_long_poll_reads_the_call_only_for_a_notice_that_can_end_it() -> None:
    call = factories.call(factories.server("deploy"), status=ToolCall.Status.QUEUED)
    reads, load = _status_reads(call.pk)

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
        await sync_to_async(factories.finish_call)(call.pk)
        await asyncio.wait_for(waiting, timeout=4)  # woken by the notice, well before the 5 s re-read
        return time.monotonic() - started

    took = asyncio.run(scenario())

    # The notice of the final status ends the wait by itself: the caller reads the whole call next.
    assert reads == ["queued"]
    assert took < 4


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("live_db")
def test_a_notice_that_names_no_status_wakes_the_long_poll_to_read() -> None:
    call = factories.call(factories.server("deploy"), status=ToolCall.Status.QUEUED)
    reads, load = _status_reads(call.pk)

    async def scenario() -> None:
        waiting = asyncio.create_task(broadcast.wait_until_final(call.pk, 30, load))
        while not reads:
            await asyncio.sleep(0.01)
        await sync_to_async(ToolCall.objects.filter(pk=call.pk).update)(status=ToolCall.Status.CANCELLED)
        # A wake that says nothing of the status: the wait cannot know, so it reads the call.
        await sync_to_async(broadcast.next_seq)(broadcast.call_group(call.pk), {"type": "call.changed"})
        await asyncio.wait_for(waiting, timeout=4)

    asyncio.run(scenario())

    assert reads == ["queued", "cancelled"]


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("live_db")
def test_a_question_passed_through_to_the_requester_wakes_the_gateways_wait() -> None:
    """The gateway's wait ends when the call is final or when a round asks the agent's own client
    (`catalog.call_row`). The notice of such a round named the call's status, `awaiting_input`, which no
    call's wait was woken by: the question reached the client at the wait's next re-read, 5 s later."""
    from approvals.gateway import catalog
    from approvals.services import rounds

    call = factories.call(factories.server("deploy"), status=ToolCall.Status.RUNNING)
    reads: list[bool] = []

    async def load() -> catalog.Wake:
        wake = await sync_to_async(catalog.call_row)(call.pk)
        reads.append(wake.is_final)
        return wake

    def ask() -> None:
        rnd = factories.open_round(call, keys=("sign_in",))
        pending = list(rnd.input_requests.select_related("team", "escalation_team"))
        InputRequest.objects.filter(round=rnd).update(for_requester=True)
        for ir in pending:
            ir.for_requester = True
        rounds._announce(rnd.pk, call.pk, pending)  # what runs once the round is committed

    async def scenario() -> float:
        waiting = asyncio.create_task(broadcast.wait_until_final(call.pk, 30, load))
        while not reads:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await sync_to_async(ask)()
        await asyncio.wait_for(waiting, timeout=10)
        return time.monotonic() - started

    took = asyncio.run(scenario())

    assert reads == [False, True]
    assert took < 2.5, took  # woken by the notice, not by the re-read at 5 s


@pytest.mark.parametrize(
    ("message", "wakes"),
    [
        ({"type": "call.changed", "status": "running"}, False),
        ({"type": "call.changed", "status": "awaiting_input"}, False),
        ({"type": "call.changed", "status": "completed"}, True),
        ({"type": "call.changed", "status": "answered"}, True),
        ({"type": "call.changed"}, True),  # names no status: the wait reads the call to know
        # questions passed through to the agent's own client: the gateway's wait hands them over
        ({"type": "call.changed", "status": "awaiting_input", "event": "requester.asked"}, True),
        ({"type": "queue.changed", "event": "round.opened"}, True),
    ],
)
def test_which_notices_wake_a_call_long_poll(message: dict[str, str], wakes: bool) -> None:
    assert broadcast._final_notice(message) is wakes


@pytest.mark.parametrize(
    ("message", "ends"),
    [
        ({"type": "call.changed", "status": "completed"}, True),
        ({"type": "call.changed", "status": "cancelled"}, True),
        ({"type": "call.changed", "status": "resuming"}, False),
        ({"type": "call.changed", "status": "awaiting_input", "event": "requester.asked"}, False),
        ({"type": "call.changed"}, False),  # the wait reads the call to know
        ({"type": "queue.changed", "status": "completed"}, False),  # not the call's own notice
    ],
)
def test_which_notices_end_a_call_long_poll_without_a_read(message: dict[str, str], ends: bool) -> None:
    assert broadcast._names_final(message) is ends


# ---- the wakes: one Redis subscription per process ---------------------------------------------------


def _redis() -> redis.Redis:
    return redis.Redis.from_url(str(settings.CACHES["default"]["LOCATION"]))


async def _reads_until(group: str, reads: list[float], stop: asyncio.Event, seconds: float) -> None:
    """A long-poll on `group` whose check records each read and ends once `stop` is set."""
    loop = asyncio.get_running_loop()

    async def done() -> bool:
        reads.append(loop.time())
        return stop.is_set()

    await broadcast.wait_until([group], seconds, done)


def test_a_notice_wakes_the_long_polls_on_its_group_only_and_they_cost_the_channel_layer_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each long-poll joined (and left) a channel-layer group, and every notice was stored for the process
    # and received from Redis. Now a notice's wake comes over one subscription per process.
    layer_calls: list[str] = []
    layer = get_channel_layer()
    for name in ("group_add", "group_discard", "receive", "new_channel"):
        real = getattr(layer, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            layer_calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(layer, name, spy)
    group, other = f"team.wake-{uuid.uuid4().hex[:8]}", f"team.wake-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[list[float], list[float], float]:
        mine: list[float] = []
        theirs: list[float] = []
        stop = asyncio.Event()
        polls = [
            asyncio.create_task(_reads_until(group, mine, stop, 30)),
            asyncio.create_task(_reads_until(other, theirs, asyncio.Event(), 3)),
        ]
        while not mine or not theirs:
            await asyncio.sleep(0.01)
        stop.set()  # the next read ends the first long-poll: when a wake makes it read
        started = asyncio.get_running_loop().time()
        await sync_to_async(broadcast.queue_changed)("round.opened", uuid.uuid4(), [])  # no team: no wake
        await sync_to_async(broadcast._send)(
            group,
            broadcast.QueueChanged(
                type="queue.changed", event="round.opened", call="c", input_requests=[], group=group, seq=None
            ),
        )
        await asyncio.wait_for(polls[0], timeout=3)
        took = asyncio.get_running_loop().time() - started
        polls[1].cancel()
        return mine, theirs, took

    mine, theirs, took = asyncio.run(scenario())
    assert len(mine) == 2 and took < 2  # woken by the wake, well before the 5 s re-read
    assert len(theirs) == 1  # another group's long-poll was not woken
    assert layer_calls == []


def test_a_lost_subscription_is_made_again_and_every_long_poll_reads_again() -> None:
    group = f"call.{uuid.uuid4()}"
    reads: list[float] = []

    async def scenario() -> tuple[float, float]:
        stop = asyncio.Event()
        poll = asyncio.create_task(_reads_until(group, reads, stop, 30))
        while not reads:
            await asyncio.sleep(0.01)
        wakes = broadcast._loop_wakes()
        assert wakes.subscribed.is_set()
        # Redis drops the subscription's connection (a restart, a failover, a proxy's idle limit).
        client = _redis()
        ours = [line for line in client.client_list(_type="pubsub") if line.get("name") == wakes.name]
        assert len(ours) == 1
        client.client_kill_filter(_id=ours[0]["id"])
        lost = asyncio.get_running_loop().time()
        while wakes.subscribed.is_set():
            await asyncio.sleep(0.01)
        while not wakes.subscribed.is_set():
            await asyncio.sleep(0.01)
        back = asyncio.get_running_loop().time() - lost
        while len(reads) < 2:  # woken by the new subscription: a wake sent meanwhile would be lost
            await asyncio.sleep(0.01)
        reread = reads[1] - lost
        # The new subscription carries wakes.
        stop.set()
        await sync_to_async(broadcast.next_seq)(group, {"type": "call.changed", "status": "completed"})
        await asyncio.wait_for(poll, timeout=3)
        return back, reread

    back, reread = asyncio.run(scenario())
    assert back < 4  # made again after WAKE_RETRY
    assert reread < 4  # well before the 5 s re-read
    assert len(reads) == 3


def test_without_the_subscription_a_long_poll_reads_every_second(caplog: pytest.LogCaptureFixture) -> None:
    group = f"call.{uuid.uuid4()}"
    reads: list[float] = []
    caches = {"default": {**settings.CACHES["default"], "LOCATION": unreachable_redis_url()}}

    async def scenario() -> None:
        stop = asyncio.Event()
        poll = asyncio.create_task(_reads_until(group, reads, stop, 30))
        await asyncio.sleep(3.5)
        stop.set()
        await asyncio.wait_for(poll, timeout=2)

    with override_settings(CACHES=caches), caplog.at_level(logging.WARNING, logger="approvals.broadcast"):
        asyncio.run(scenario())
    assert 4 <= len(reads) <= 6  # the first read, then one a second, then the one that ended it
    gaps = [b - a for a, b in itertools.pairwise(reads)]
    assert all(gap < 1.5 for gap in gaps)
    assert [r.getMessage() for r in caplog.records].count(
        "long-poll wakes down (Redis unavailable): long-polls read each second"
    ) == 1


def test_only_notices_a_long_poll_can_want_are_published_as_wakes() -> None:
    call_id = uuid.uuid4()
    team = f"team.wake-{uuid.uuid4().hex[:8]}"
    subscriber = _redis().pubsub(ignore_subscribe_messages=True)
    subscriber.psubscribe(broadcast.wake_channel("*"))
    try:
        while subscriber.get_message(timeout=0.2) is not None:
            pass
        for status in ("running", "awaiting_input", "resuming", "completed"):
            broadcast._send(
                broadcast.call_group(call_id),
                broadcast.CallChanged(
                    type="call.changed", call=str(call_id), status=status, group="", seq=None
                ),
            )
        broadcast._send(
            team,
            broadcast.PresenceChanged(
                type="presence.changed", input_request="r", viewers=["ann"], group=team, seq=None
            ),
        )
        seen: list[tuple[str, dict[str, Any]]] = []
        deadline = time.monotonic() + 3
        while len(seen) < 2 and time.monotonic() < deadline:
            message = subscriber.get_message(timeout=0.2)
            if message is not None:
                channel = message["channel"].decode().removeprefix(broadcast.wake_channel(""))
                seen.append((channel, json.loads(message["data"])))
        while (message := subscriber.get_message(timeout=0.3)) is not None:
            seen.append(("late", message))
    finally:
        subscriber.close()
    # A call's long-polls wait for its end: of its four notices only the final one wakes; every team notice
    # may change an inbox.
    assert seen == [
        (f"call.{call_id}", {"type": "call.changed", "status": "completed"}),
        (team, {"type": "presence.changed"}),
    ]


def test_a_quiet_subscription_is_pinged_and_stays_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broadcast, "WAKE_PING_EVERY", 0.25)
    group = f"call.{uuid.uuid4()}"
    reads: list[float] = []

    async def scenario() -> float:
        stop = asyncio.Event()
        poll = asyncio.create_task(_reads_until(group, reads, stop, 30))
        while not reads:
            await asyncio.sleep(0.01)
        wakes = broadcast._loop_wakes()
        await asyncio.sleep(1.5)  # six pings' time: each answered, so the subscription is never given up
        assert wakes.subscribed.is_set()
        assert len(reads) == 1  # a ping's answer wakes no long-poll
        stop.set()
        started = asyncio.get_running_loop().time()
        await sync_to_async(broadcast.next_seq)(group, {"type": "call.changed", "status": "completed"})
        await asyncio.wait_for(poll, timeout=3)
        return asyncio.get_running_loop().time() - started

    assert asyncio.run(scenario()) < 1
