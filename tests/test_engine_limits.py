"""The engines under real use: an idle websocket stays up, long-polls hold no database connection.

Both run against a real Daphne on the suite's PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any
from unittest.mock import patch

import httpx
import pytest
import websockets
from asgiref.sync import async_to_sync, sync_to_async
from channels_redis.core import RedisChannelLayer
from django.db import connection
from django.test import Client

from approvals import broadcast
from approvals.models import Membership, ToolCall
from approvals.services import tokens
from tests import factories
from tests.live import Daphne, child_env

pytestmark = pytest.mark.timeout(180)

IDLE = 24  # seconds an idle websocket waits for nothing (see the test below)


def _session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.mark.usefixtures("live_db")
def test_an_idle_socket_stays_open_and_still_receives_events(web: Daphne) -> None:
    """channels-redis blocks 5 s in BRPOP; a Redis read timeout at or below that closed every idle socket
    with 1011 within seconds. Left idle for IDLE s (four such waits and more, and past Daphne's keep-alive
    ping at 20 s), the same connection must still get the next event."""
    alice = factories.user("alice")
    team = factories.team(f"release-{uuid.uuid4().hex[:8]}", (alice, Membership.Role.REVIEWER))
    server = factories.server("deploy", name="Deploy bot", default_team=team)
    cookie = _session_cookie(alice)

    def open_request() -> Any:
        rnd = factories.open_round(factories.call(server), team_=team)
        return rnd.input_requests.select_related("round__call", "team").get()

    async def scenario() -> None:
        async with websockets.connect(
            web.url.replace("http", "ws") + "/ws/queue/",
            origin=web.url,  # type: ignore[arg-type]
            additional_headers={"Cookie": f"sessionid={cookie}"},
            ping_interval=None,  # no keep-alive frames: the socket is truly idle
        ) as ws:
            hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert hello["type"] == "hello"
            # Idle: nothing is sent either way. A closed socket ends this recv with ConnectionClosed.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), IDLE)
            ir = await sync_to_async(open_request)()
            await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
            card = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert card["type"] == "card"
            assert card["input_requests"] == [str(ir.pk)]

    async_to_sync(scenario)()


def _backends(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        return int(cursor.fetchone()[0])


@pytest.mark.usefixtures("live_db")
def test_long_polls_hold_no_database_connection_while_they_wait() -> None:
    """Twelve agents long-polling one web process with a pool of four: the process never has more than
    four connections, and every long-poll and every plain read in between is answered."""
    server = factories.server("deploy", name="Deploy bot")
    agent, token = tokens.agent_create(name="poller", servers=[server])
    call = factories.call(server, agent)
    assert not call.is_final
    name = f"longpoll-{uuid.uuid4().hex[:8]}"
    env = child_env(ELICIT_DB_POOL_MAX="4", ELICIT_DB_POOL_MIN="0", ELICIT_DB_POOL_TIMEOUT="3")
    env["DATABASE_URL"] += f"?application_name={name}"
    web = Daphne(env).start()
    try:
        headers = {"Authorization": f"Bearer {token}"}
        url = f"{web.url}/api/v1/calls/{call.pk}"

        async def scenario() -> tuple[list[int], list[int], int]:
            async with httpx.AsyncClient(headers=headers, timeout=60) as client:
                polls = [asyncio.ensure_future(client.get(url, params={"wait": 6})) for _ in range(12)]
                peak, reads = 0, []
                while not all(p.done() for p in polls):
                    peak = max(peak, await sync_to_async(_backends)(name))
                    reads.append((await client.get(url)).status_code)
                    await asyncio.sleep(0.2)
                return [(await p).status_code for p in polls], reads, peak

        polls, reads, peak = async_to_sync(scenario)()
        assert polls == [200] * 12
        assert reads and set(reads) == {200}
        assert 0 < peak <= 4
        assert ToolCall.objects.get(pk=call.pk).status == call.status
    finally:
        web.stop()


def test_a_cancelled_receive_always_ends() -> None:
    """Closing a websocket cancels its consumer's receive. channels-redis (with redis-py 8) can lose that
    cancellation and BRPOP on for good; the hub's layer cancels again until the receive has ended."""
    from channels.layers import get_channel_layer

    async def scenario() -> int:
        layer = get_channel_layer()
        stuck = 0
        for n in range(40):
            receive = asyncio.ensure_future(layer.receive(await layer.new_channel()))
            await asyncio.sleep((0, 0.001, 0.01, 0.05)[n % 4])
            receive.cancel()
            done, _ = await asyncio.wait([receive], timeout=15)
            stuck += not done
        return stuck

    assert async_to_sync(scenario)() == 0


def test_a_receive_cancelled_twice_still_ends_its_inner_receive() -> None:
    """A consumer shutting down cancels its receive twice (itself, then the event loop's shutdown). The
    second cancellation must not orphan the library's receive while it drains: that orphan, having lost the
    first cancellation, BRPOPs for good and the event loop's shutdown waits on it forever."""
    from approvals.channel_layer import ChannelLayer

    swallowed = []

    async def stubborn_receive(self: Any, channel: str) -> dict[str, str]:
        # Stands in for channels-redis at its unlucky moment: the first cancellation is lost.
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(channel)

    async def scenario() -> tuple[bool, set[asyncio.Task[Any]]]:
        layer = ChannelLayer.__new__(ChannelLayer)
        receive = asyncio.ensure_future(layer.receive("specific.x!y"))
        await asyncio.sleep(0.01)
        receive.cancel()
        await asyncio.sleep(0.01)
        receive.cancel()  # the second cancellation arrives while the first is being drained
        await asyncio.wait([receive], timeout=5)
        await asyncio.sleep(0)
        lingering = asyncio.all_tasks() - {asyncio.current_task()}
        for task in lingering:
            task.cancel()  # so the test's own loop can close even when the assertion below fails
        return receive.cancelled(), lingering

    with patch.object(RedisChannelLayer, "receive", stubborn_receive):
        cancelled, lingering = async_to_sync(scenario)()
    assert swallowed == ["specific.x!y"]
    assert cancelled
    assert lingering == set()
