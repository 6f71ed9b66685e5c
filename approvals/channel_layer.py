"""The channel layer: channels-redis's, with a receive that always ends when it is cancelled.

A receive cancelled at an unlucky moment inside channels-redis / redis-py loses the cancellation (the task
is marked cancelling but goes on), and channels-redis then loops on BRPOP for good: the websocket consumer
that was closed never finishes, and an event loop shutting down waits on it forever. Here the library's
receive runs as an inner task that is cancelled again until it has really ended. Cancellations that arrive
while it drains (a consumer shutting down cancels its receive twice: once itself, once through the event
loop's shutdown) are absorbed and raised once the inner task is gone, so the inner task is never orphaned.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels_redis.core import RedisChannelLayer

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


class ChannelLayer(RedisChannelLayer):
    async def receive(self, channel: str) -> Any:
        inner = asyncio.ensure_future(super().receive(channel))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            await drain(inner)
            raise
