"""Websocket addresses the hub does not serve: refused quietly, never a crash of the application (a
traceback logged at ERROR level per attempt, which anyone may make)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator

from elicit_hub.asgi import application

pytestmark = pytest.mark.timeout(30)

HOST = "127.0.0.1:8000"


@pytest.fixture(autouse=True)
def own_channel_layer() -> None:
    channel_layers.backends.clear()


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/queue/extra", "/", "/ws/queue"])
def test_a_socket_opened_on_an_address_the_hub_does_not_serve_is_refused_without_an_error(path: str) -> None:
    async def attempt() -> tuple[bool, int | None]:
        headers = [(b"host", HOST.encode()), (b"origin", f"http://{HOST}".encode())]
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect()
        await communicator.wait()  # the application ended without raising
        return connected, code

    connected, code = async_to_sync(attempt)()
    assert not connected
    assert code == 4404
