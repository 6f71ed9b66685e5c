"""The hub's channel layer (`approvals.channel_layer.ChannelLayer`) on the real Redis: its ``group_send``.

Every notice (a round opened, an answer, a call's change) is one ``group_send`` from a worker or the web
process, so its round trips are paid several times per call.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.core.cache import cache
from redis.asyncio.connection import AbstractConnection
from redis.connection import AbstractConnection as SyncConnection

from approvals import broadcast
from approvals.channel_layer import ChannelLayer

T = TypeVar("T")


def with_layer(scenario: Callable[[ChannelLayer], Awaitable[T]], **options: Any) -> T:
    """Run `scenario` on a layer of its own (its own prefix on the suite's Redis), then empty and close it."""
    hosts = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]

    async def run() -> T:
        layer = ChannelLayer(hosts=hosts, prefix=f"test-{uuid.uuid4().hex[:8]}", **options)
        try:
            return await scenario(layer)
        finally:
            await layer.flush()
            await layer.close_pools()

    return async_to_sync(run)()


async def receive(layer: ChannelLayer, channel: str, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        return await asyncio.wait_for(layer.receive(channel), timeout)
    except TimeoutError:
        return None


def test_a_group_send_reaches_every_member_once() -> None:
    async def scenario(layer: ChannelLayer) -> list[Any]:
        # Two sockets of one process share a Redis key; a named channel has its own.
        first, second = await layer.new_channel(), await layer.new_channel()
        named = "queue-listener"
        for channel in (first, second, named):
            await layer.group_add("team.release", channel)
        await layer.group_add("team.other", await layer.new_channel())

        await layer.group_send("team.release", {"type": "queue.changed", "seq": 7})

        got = [await receive(layer, channel) for channel in (first, second, named)]
        again = [await receive(layer, channel, timeout=0.3) for channel in (first, second, named)]
        return [got, again]

    got, again = with_layer(scenario)
    assert [message["seq"] if message else None for message in got] == [7, 7, 7]
    assert again == [None, None, None]


def test_a_group_send_takes_two_round_trips_to_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's took four: the removal of expired members, the members, the removal of expired messages
    (a pipeline), and the script's whole text (EVAL)."""
    sent: list[int] = []
    real = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append(1)
        await real(self, command, check_health)

    async def scenario(layer: ChannelLayer) -> int:
        for _ in range(3):
            await layer.group_add("team.release", await layer.new_channel())
        await layer.group_send("team.release", {"type": "queue.changed"})  # the script is cached from here
        monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
        await layer.group_send("team.release", {"type": "queue.changed"})
        monkeypatch.undo()
        return len(sent)

    assert with_layer(scenario) == 2


def test_a_redis_that_forgot_the_script_still_gets_the_message() -> None:
    async def scenario(layer: ChannelLayer) -> Any:
        channel = await layer.new_channel()
        await layer.group_add("team.release", channel)
        await layer.group_send("team.release", {"type": "queue.changed", "seq": 1})
        await receive(layer, channel)
        await layer.connection(0).script_flush()  # as after a restart of Redis

        await layer.group_send("team.release", {"type": "queue.changed", "seq": 2})
        return await receive(layer, channel)

    message = with_layer(scenario)
    assert message is not None and message["seq"] == 2


def test_a_full_channel_loses_the_message_and_the_others_still_get_it() -> None:
    async def scenario(layer: ChannelLayer) -> list[Any]:
        full, free = "full-listener", "free-listener"
        for channel in (full, free):
            await layer.group_add("team.release", channel)
        await layer.send(full, {"type": "queue.changed", "seq": 0})  # capacity 1: now full

        await layer.group_send("team.release", {"type": "queue.changed", "seq": 1})

        first, second = await receive(layer, full), await receive(layer, full, timeout=0.3)
        return [first, second, await receive(layer, free)]

    first_on_full, second_on_full, on_free = with_layer(scenario, capacity=1)
    assert first_on_full is not None and first_on_full["seq"] == 0
    assert second_on_full is None
    assert on_free is not None and on_free["seq"] == 1


def test_expired_messages_are_dropped_before_the_new_one_is_counted() -> None:
    """A message nobody received within the expiry is removed as the next one arrives: it neither reaches
    the channel late nor holds its place against the capacity."""

    async def scenario(layer: ChannelLayer) -> list[Any]:
        channel = "slow-listener"
        await layer.group_add("team.release", channel)
        await layer.send(channel, {"type": "queue.changed", "seq": 0})
        await asyncio.sleep(2.2)  # past the expiry (whole seconds: the library compares integer times)

        await layer.group_send("team.release", {"type": "queue.changed", "seq": 1})

        return [await receive(layer, channel), await receive(layer, channel, timeout=0.3)]

    first, second = with_layer(scenario, capacity=1, expiry=1)
    assert first is not None and first["seq"] == 1
    assert second is None


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per packet this process's Redis clients send from now on, sync or asyncio, in any thread
    (a pipeline is one)."""
    sent: list[str] = []
    real_sync, real_async = SyncConnection.send_packed_command, AbstractConnection.send_packed_command

    def counting(self: SyncConnection, command: Any, check_health: bool = True) -> None:
        sent.append("sync")
        real_sync(self, command, check_health)

    async def counting_async(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append("asyncio")
        await real_async(self, command, check_health)

    monkeypatch.setattr(SyncConnection, "send_packed_command", counting)
    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting_async)
    return sent


def notice(group: str) -> broadcast.QueueChanged:
    return broadcast.QueueChanged(
        type="queue.changed",
        event="round.opened",
        call="c",
        input_requests=[],
        round=1,
        group=group,
        seq=None,
    )


def test_a_notice_from_sync_code_is_numbered_and_reaches_every_member_in_two_round_trips(
    monkeypatch: pytest.MonkeyPatch, round_trips: list[str]
) -> None:
    """A worker's notice: its number and the group's members in one pipeline, the message in one script; no
    hop to an event loop (the layer's asyncio ``group_send`` took one, and a round trip more)."""
    group = f"team.sync-{uuid.uuid4().hex[:8]}"

    async def scenario(layer: ChannelLayer) -> tuple[list[Any], list[int]]:
        monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
        first, second = await layer.new_channel(), "queue-listener"
        for channel in (first, second):
            await layer.group_add(group, channel)
        await sync_to_async(broadcast._send)(group, notice(group))  # the script is cached from here
        round_trips.clear()
        await sync_to_async(broadcast._send)(group, notice(group))
        trips = len(round_trips)
        got = [await receive(layer, channel) for channel in (first, second, first, second)]
        return got, [trips]

    try:
        got, (trips,) = with_layer(scenario)
    finally:
        cache.delete(broadcast._seq_key(group))
    assert [message["seq"] if message else None for message in got] == [1, 1, 2, 2]
    assert {message["event"] for message in got if message} == {"round.opened"}
    assert trips == 2


def test_a_notice_nobody_listens_to_takes_one_round_trip(
    monkeypatch: pytest.MonkeyPatch, round_trips: list[str]
) -> None:
    group = f"call.{uuid.uuid4()}"  # a call no page watches: most of a call's notices

    async def scenario(layer: ChannelLayer) -> int:
        monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
        round_trips.clear()
        await sync_to_async(broadcast._send)(group, notice(group))
        return len(round_trips)

    try:
        assert with_layer(scenario) == 1
        assert broadcast.next_seq(group) == 2  # it was numbered all the same
    finally:
        cache.delete(broadcast._seq_key(group))


def test_a_layer_on_another_redis_than_the_cache_sends_through_its_own_loop() -> None:
    hosts = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    elsewhere = [{**hosts[0], "address": "redis://127.0.0.1:1/0"}]
    assert broadcast._blocking(ChannelLayer(hosts=hosts))
    assert not broadcast._blocking(ChannelLayer(hosts=elsewhere))
    assert not broadcast._blocking(ChannelLayer(hosts=[*hosts, *hosts]))  # a sharded layer


def test_a_redis_that_forgot_the_script_still_gets_a_notice_from_sync_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = f"team.sync-{uuid.uuid4().hex[:8]}"

    async def scenario(layer: ChannelLayer) -> Any:
        monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        await sync_to_async(broadcast._send)(group, notice(group))
        await receive(layer, channel)
        await layer.connection(0).script_flush()  # as after a restart of Redis

        await sync_to_async(broadcast._send)(group, notice(group))
        return await receive(layer, channel)

    try:
        message = with_layer(scenario)
    finally:
        cache.delete(broadcast._seq_key(group))
    assert message is not None and message["seq"] == 2
