"""The channel layer: channels-redis's, with a receive that always ends when it is cancelled.

A receive cancelled at an unlucky moment inside channels-redis / redis-py loses the cancellation (the task
is marked cancelling but goes on), and channels-redis then loops on BRPOP for good: the websocket consumer
that was closed never finishes, and an event loop shutting down waits on it forever. Here the library's
receive runs as an inner task that is cancelled again until it has really ended. Cancellations that arrive
while it drains (a consumer shutting down cancels its receive twice: once itself, once through the event
loop's shutdown) are absorbed and raised once the inner task is gone, so the inner task is never orphaned.

Its ``group_send`` makes two round trips to Redis instead of four: the group's members are read in one
pipeline with the removal of its expired members, and each connection's channels get the message, after
their expired messages are removed, in one cached script (EVALSHA). The library sent the removal of expired
messages as a pipeline of its own, then the whole script's text (EVAL) on every send. Sync code (a worker, a
view) sends the same two round trips through a sync client, the first one shared with the notice's sequence
number (``queue_members_read``, ``deliver_blocking``; ``approvals.broadcast``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import redis
from channels_redis.core import RedisChannelLayer
from redis.exceptions import NoScriptError

logger = logging.getLogger(__name__)

# How long a cancelled receive keeps cancelling its inner task before it lets it go (it should take one
# BRPOP round trip; past this something below is wedged and waiting longer helps nobody).
DRAIN_SECONDS = 10.0
RECANCEL_EVERY = 0.25


async def drain(inner: asyncio.Future[Any]) -> None:
    """Cancel `inner` until it has ended, however often the caller is cancelled meanwhile."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    while not inner.done():
        if loop.time() > deadline:
            logger.warning("a cancelled channel-layer receive did not end within %.0f s", DRAIN_SECONDS)
            return
        inner.cancel()
        try:
            await asyncio.wait([inner], timeout=RECANCEL_EVERY)
        except asyncio.CancelledError:
            continue  # already on the way out: keep draining, the caller's cancellation is raised after
    if not inner.cancelled():
        inner.exception()  # retrieved, so an error on the way out is not logged as unhandled


# KEYS: the channels' Redis keys; ARGV: a message per key, a capacity per key, then the time, the expiry
# of a message, and the score under which a message has expired.
DELIVER = """
local over_capacity = 0
local n = #KEYS
local now, expiry, expired = ARGV[2 * n + 1], ARGV[2 * n + 2], ARGV[2 * n + 3]
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, expired)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + n]) then
        redis.call('ZADD', KEYS[i], now, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""
# The name Redis caches a script under (EVALSHA): its SHA-1, not a security measure.
DELIVER_SHA = hashlib.sha1(DELIVER.encode(), usedforsecurity=False).hexdigest()


class ChannelLayer(RedisChannelLayer):
    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """The library's ``group_send`` (channels-redis 4.3), in two round trips instead of four."""
        connection = self.connection(self.consistent_hash(group))
        pipe = connection.pipeline(transaction=False)
        self.queue_members_read(pipe, group)
        *_, members = await pipe.execute()
        for index, keys, args in self._deliveries(members, message):
            client = self.connection(index)
            try:
                over = await client.evalsha(DELIVER_SHA, len(keys), *keys, *args)
            except NoScriptError:  # a Redis that restarted has forgotten it: EVAL sends it and caches it
                over = await client.eval(DELIVER, len(keys), *keys, *args)
            self._note_over_capacity(over, len(members), group)

    def queue_members_read(self, pipe: Any, group: str) -> None:
        """Queue on `pipe` (of either client, sync or asyncio) the removal of the group's expired members and
        the read of the others: the pipeline's last result is then the members, for ``deliver_blocking``."""
        assert self.require_valid_group_name(group), "Group name not valid"
        key = self._group_key(group)
        pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
        pipe.zrange(key, 0, -1)

    def deliver_blocking(
        self, client: redis.Redis, members: list[bytes], message: dict[str, Any], group: str
    ) -> None:
        """``group_send``'s second half from sync code, on `client` (the layer's one Redis, through a sync
        client): `message` to every one of `members`, as ``queue_members_read`` read them. A worker's or a
        view's notice then needs no hop to an event loop of its own (``approvals.broadcast``)."""
        for index, keys, args in self._deliveries(members, message):
            assert index == 0, "a blocking delivery needs the layer on one Redis"
            try:
                over = client.evalsha(DELIVER_SHA, len(keys), *keys, *args)
            except NoScriptError:
                over = client.eval(DELIVER, len(keys), *keys, *args)
            self._note_over_capacity(over, len(members), group)

    def _deliveries(
        self, members: list[bytes], message: dict[str, Any]
    ) -> Iterator[tuple[int, list[Any], list[Any]]]:
        """For each of the layer's connections: the channels' keys on it, and the DELIVER script's arguments
        (the message for each key, each key's capacity, the time, the expiry, the score of an expired one)."""
        channels = [member.decode("utf8") for member in members]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(channels, message)
        for index, keys in by_connection.items():
            now = time.time()
            args = [
                *(messages[key] for key in keys),
                *(capacities[key] for key in keys),
                now,
                self.expiry,
                int(now) - int(self.expiry),
            ]
            yield index, keys, args

    @staticmethod
    def _note_over_capacity(over: Any, members: int, group: str) -> None:
        if over:
            logger.info("%s of %s channels over capacity in group %s", over, members, group)

    async def receive(self, channel: str) -> Any:
        inner = asyncio.ensure_future(super().receive(channel))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            await drain(inner)
            raise
