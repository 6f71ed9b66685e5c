"""An open queue socket whose session expires (its time ran out: no sign-out, no counter moved) stops
receiving at once and is closed as signed out, through the real ASGI app, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.utils import timezone

from approvals import broadcast
from tests import test_consumers
from tests.test_consumers import (  # noqa: F401  (fixtures: used by name)
    connected,
    open_request,
    own_channel_layer,
    run,
    socket,
)

world = test_consumers.world  # the fixture, by its name

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]

SIGNED_OUT = {"type": "websocket.close", "code": 4401}


def _session_ends_in(key: str, seconds: float) -> None:
    Session.objects.filter(session_key=key).update(expire_date=timezone.now() + timedelta(seconds=seconds))


async def _opened(world: dict[str, Any]) -> Any:
    ir = await sync_to_async(open_request)(world["deploy"], world["release"])
    await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
    return ir


async def _expired_while_open(world: dict[str, Any]) -> WebsocketCommunicator:
    """A socket opened two seconds before its session's time runs out, once it has."""
    await sync_to_async(_session_ends_in)(world["as"]["alice"], 2)
    alice = socket(world["as"]["alice"])
    await connected(alice)
    await alice.send_json_to({"type": "ping"})
    assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
    await asyncio.sleep(2.2)
    return alice


def test_a_socket_whose_session_expired_is_closed_at_the_next_ping(world) -> None:
    async def scenario() -> None:
        alice = await _expired_while_open(world)
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_output(timeout=10) == SIGNED_OUT
        await alice.disconnect()

    run(scenario)


def test_a_socket_whose_session_expired_gets_no_more_cards(world) -> None:
    async def scenario() -> None:
        alice = await _expired_while_open(world)
        await _opened(world)
        # Closed, the card unsent: what a page hears from here on is the close.
        assert await alice.receive_output(timeout=10) == SIGNED_OUT
        await alice.disconnect()

    run(scenario)


def test_a_session_extended_meanwhile_keeps_its_socket(world) -> None:
    async def scenario() -> None:
        await sync_to_async(_session_ends_in)(world["as"]["alice"], 1)
        alice = socket(world["as"]["alice"])
        await connected(alice)  # the end it knows is a second away
        await sync_to_async(_session_ends_in)(world["as"]["alice"], 3600)  # a request renewed the session
        await asyncio.sleep(1.2)
        ir = await _opened(world)
        card = await alice.receive_json_from(timeout=10)
        assert card["type"] == "card" and card["input_requests"] == [str(ir.pk)]
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
        await alice.disconnect()

    run(scenario)
