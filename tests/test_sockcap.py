"""One account cannot hold a process's sockets: past MAX_SOCKETS_PER_USER open at once on a process, a new
socket of theirs is closed with TOO_MANY_SOCKETS as it opens; another user's still opens, and a socket that
closes (however it ends) makes room again. Through the real ASGI application, channel layer and Redis."""

from __future__ import annotations

from typing import Any

import pytest

from approvals import consumers
from tests import test_consumers
from tests.test_consumers import (  # noqa: F401  (fixtures: used by name)
    connected,
    own_channel_layer,
    run,
    socket,
)

world = test_consumers.world  # the fixture, by its name

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]


async def _refused(communicator: Any) -> int:
    ok, _ = await communicator.connect()
    assert ok  # accepted, so that the page's browser is told why
    output = await communicator.receive_output(timeout=10)
    assert output["type"] == "websocket.close"
    return int(output["code"])


def test_a_user_past_the_cap_is_refused_and_a_closed_socket_makes_room(world, monkeypatch) -> None:
    monkeypatch.setattr(consumers, "MAX_SOCKETS_PER_USER", 3)

    async def scenario() -> None:
        alices = [socket(world["as"]["alice"]) for _ in range(3)]
        for alice in alices:
            await connected(alice)
        assert await _refused(socket(world["as"]["alice"])) == consumers.TOO_MANY_SOCKETS

        bob = socket(world["as"]["bob"])  # another account is not held back by alice's sockets
        await connected(bob)

        await alices[0].disconnect()
        again = socket(world["as"]["alice"])
        await connected(again)
        assert await _refused(socket(world["as"]["alice"])) == consumers.TOO_MANY_SOCKETS
        for communicator in [*alices[1:], again, bob]:
            await communicator.disconnect()
        assert not consumers.QueueConsumer.open_sockets  # nothing left counted

    run(scenario)


def test_a_socket_whose_handler_failed_no_longer_counts(world, monkeypatch) -> None:
    monkeypatch.setattr(consumers, "MAX_SOCKETS_PER_USER", 1)

    async def broken(self: Any) -> None:
        raise RuntimeError("a handler failed")

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        with monkeypatch.context() as patch:
            patch.setattr(consumers.QueueConsumer, "_check_counters", broken)
            await alice.send_json_to({"type": "ping"})
            with pytest.raises(RuntimeError):
                await alice.receive_output(timeout=10)
        again = socket(world["as"]["alice"])
        await connected(again)  # the failed socket's place was given back
        await again.disconnect()
        assert not consumers.QueueConsumer.open_sockets

    run(scenario)
