"""What a client sends on the queue socket is small JSON, a few messages at a time: anything else (binary,
not JSON, oversized, a flood) closes the socket with the standard code saying why, without an exception
in the hub's logs and without a database read per message."""

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


async def closed_after(world: dict[str, Any], text: str | None = None, data: bytes | None = None) -> Any:
    alice = socket(world["as"]["alice"])
    await connected(alice)
    await alice.send_to(text_data=text, bytes_data=data)
    output = await alice.receive_output(timeout=10)
    await alice.disconnect()
    return output


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"data": b"\x00\x01binary"}, 1003),
        ({"text": "{not json"}, 1007),
        ({"text": "[" * 3000 + "]" * 3000}, 1009),
        ({"text": '{"type": "ping", "pad": "' + "x" * (64 * 1024) + '"}'}, 1009),
        ({"text": "[" * 2000 + "]" * 2000}, 1007),
    ],
    ids=["binary", "not-json", "deep-and-large", "large", "too-deep"],
)
def test_a_frame_the_page_never_sends_closes_the_socket_with_its_code(
    world, monkeypatch, frame, code
) -> None:
    if len(frame.get("text", "")) == 4000:
        monkeypatch.setattr(
            consumers, "MAX_FRAME", 8 * 1024, raising=False
        )  # within the size limit: only too deep

    async def scenario() -> None:
        assert await closed_after(world, **frame) == {"type": "websocket.close", "code": code}

    run(scenario)


def test_a_flood_of_messages_closes_the_socket(world, monkeypatch) -> None:
    reads: list[str] = []
    may_view = consumers.QueueConsumer._may_view_call

    def counting(self: Any, call_id: str) -> bool:
        reads.append(call_id)
        return may_view(self, call_id)

    monkeypatch.setattr(consumers.QueueConsumer, "_may_view_call", counting)

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        sent = 200
        for n in range(sent):
            # Calls of other teams, or none at all: each one refused after a database read.
            await alice.send_json_to({"type": "watch_call", "call": f"00000000-0000-0000-0000-{n:012d}"})
        answers = 0
        while True:
            output = await alice.receive_output(timeout=10)
            if output["type"] == "websocket.close":
                assert output["code"] == consumers.TOO_MANY_MESSAGES
                break
            answers += 1
        assert answers < sent // 2
        assert len(reads) == answers
        await alice.disconnect()

    run(scenario)


def test_the_pages_own_pace_is_never_limited(world) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        await alice.send_json_to({"type": "watch_call", "call": "00000000-0000-0000-0000-000000000000"})
        assert (await alice.receive_json_from(timeout=10))["type"] == "refused"
        for _ in range(consumers.MESSAGE_BURST - 1):
            await alice.send_json_to({"type": "ping"})
            assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
        await alice.disconnect()

    run(scenario)
