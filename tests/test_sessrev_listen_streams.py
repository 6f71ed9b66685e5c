"""The gateway's bookkeeping of the clients it tells of tool list changes (`approvals.gateway.changes`): a
client counts against its agent's share only while it is watched, and a session whose GET stream was closed
for a token since replaced is watched again once its requests carry the new one. The watcher and the
server middleware themselves, driven as the SDK drives them; no database read is needed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest
from starlette.requests import Request

from approvals.gateway import changes
from approvals.gateway.catalog import SCOPE_KEY
from approvals.gateway.server import listen_handler, session_watcher


def test_a_listen_stream_cancelled_before_it_is_watched_is_not_counted() -> None:
    """A client that goes while its stream is still being set up (the watcher busy reading) leaves nothing
    behind: a stream left counted would take its place in the agent's share for good."""

    async def scenario() -> tuple[int, int]:
        watch = changes.ToolWatch()
        request = Request({"type": "http", SCOPE_KEY: {"agent": 7, "slug": "s", "token_hash": "h"}})
        ctx: Any = SimpleNamespace(request=request, request_id=1, session=None)
        params = types.SubscriptionsListenRequestParams(
            notifications=types.SubscriptionFilter(tools_list_changed=True)
        )
        await watch._lock.acquire()  # a read for another client is under way
        listen: Any = listen_handler(watch)
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(listen(ctx, params))
        await asyncio.sleep(0.05)
        during = watch.streams_of(7)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return during, watch.streams_of(7)

    during, after = asyncio.run(scenario())
    assert during == 1
    assert after == 0


def test_a_session_whose_get_stream_was_closed_for_an_old_token_is_watched_again_with_the_new_one() -> None:
    """An agent given a new token keeps its handshake-era session (it is bound to the agent): its GET stream
    is closed at the rotation, and once the agent's requests carry the new token the session is told of
    changes again, rather than left unwatched (and remembered) until the process ends."""

    closed: list[str] = []
    transport = SimpleNamespace(close_standalone_sse_stream=lambda: closed.append("get"))
    manager: Any = SimpleNamespace(_server_instances={"sid": transport})

    def ctx(token_hash: str) -> Any:
        scope = {
            "type": "http",
            "headers": [(b"mcp-session-id", b"sid")],
            SCOPE_KEY: {"agent": 7, "slug": None, "token_hash": token_hash},
        }
        return SimpleNamespace(
            method="tools/list", protocol_version="2025-06-18", request=Request(scope), session=object()
        )

    async def call_next(_: Any) -> dict[str, Any]:
        return {"answered": True}

    async def scenario() -> list[str]:
        watch = changes.ToolWatch()
        watch.told[(7, None)] = "digest"  # this key's tools were read already
        watch._task = asyncio.get_running_loop().create_future()  # type: ignore[assignment]  # no reads here
        watching = session_watcher(watch, manager)
        assert await watching(ctx("old"), call_next) == {"answered": True}
        (listener,) = watch.listeners[(7, None)]
        # What a read that finds the agent's token changed does (`ToolWatch.check`).
        watch.remove(listener)
        await listener.end()
        assert closed == ["get"]
        watch.told[(7, None)] = "digest"  # read again (here without the database)
        await watching(ctx("new"), call_next)
        return [found.token_hash for found in watch.listeners.get((7, None), set())]

    assert asyncio.run(scenario()) == ["new"]
