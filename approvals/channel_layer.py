"""The channel layer: channels-redis's, with a receive that always ends when it is cancelled.

A receive cancelled at an unlucky moment inside channels-redis / redis-py loses the cancellation (the task
is marked cancelling but goes on), and channels-redis then loops on BRPOP for good: the websocket consumer
that was closed never finishes, and an event loop shutting down waits on it forever. Here the library's
receive runs as an inner task that is cancelled again until it has really ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels_redis.core import RedisChannelLayer


class ChannelLayer(RedisChannelLayer):
    async def receive(self, channel: str) -> Any:
        inner = asyncio.ensure_future(super().receive(channel))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            while not inner.done():
                inner.cancel()
                await asyncio.wait([inner], timeout=0.5)
            if not inner.cancelled():
                inner.exception()  # retrieved, so an error on the way out is not logged as unhandled
            raise
