"""A socket accepted only to be told why it closes (its session signs no one in, its user holds too many)
reads nothing its client sends meanwhile: such a frame used to raise in the consumer (a traceback per try,
from a client with no more than a stale cookie)."""

from __future__ import annotations

from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from approvals import consumers
from tests import factories
from tests.test_consumers import own_channel_layer, run, session_cookie, socket

__all__ = ["own_channel_layer"]

pytestmark = [pytest.mark.usefixtures("live_db", "own_channel_layer"), pytest.mark.timeout(60)]


async def told_and_then_sent_a_frame(communicator: WebsocketCommunicator, code: int) -> None:
    ok, _ = await communicator.connect()
    assert ok
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": code}
    # The client's frames that crossed the close on the way.
    await communicator.send_to(text_data='{"type": "ping"}')
    await communicator.send_to(text_data='{"type": "watch_call", "call": "x"}')
    await communicator.send_to(bytes_data=b"\x00" * 10)
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()  # raises what the consumer raised


def test_a_stale_sessions_frames_are_not_read() -> None:
    async def scenario() -> None:
        await told_and_then_sent_a_frame(socket("no-such-session"), consumers.SIGNED_OUT)

    run(scenario)


def test_frames_of_a_socket_over_its_users_limit_are_not_read(monkeypatch: Any) -> None:
    monkeypatch.setattr(consumers, "MAX_SOCKETS_PER_USER", 0)
    session = session_cookie(factories.user("erin"))

    async def scenario() -> None:
        await told_and_then_sent_a_frame(socket(session), consumers.TOO_MANY_SOCKETS)

    run(scenario)
