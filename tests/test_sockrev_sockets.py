"""The queue websocket's answers to pages whose session ended, driven through the real ASGI app (origin
check, session auth), PostgreSQL and Redis."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from approvals import broadcast, consumers
from approvals.models import Membership
from elicit_hub.asgi import application
from tests import factories

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]

HOST = "127.0.0.1:8000"
SIGNED_OUT = {"type": "websocket.close", "code": 4401}


@pytest.fixture(autouse=True)
def own_channel_layer() -> None:
    channel_layers.backends.clear()


def socket(cookie: str, origin: str = f"http://{HOST}") -> WebsocketCommunicator:
    headers = [(b"host", HOST.encode()), (b"origin", origin.encode())]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, "/ws/queue/", headers=headers)


def session_of(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def ended_session(user: Any) -> str:
    """The cookies of a browser whose session was signed out elsewhere (its cookie still held)."""
    key = session_of(user)
    elsewhere = Client()
    elsewhere.cookies["sessionid"] = key
    assert elsewhere.post("/accounts/logout/").status_code == 302
    return f"csrftoken=abc; sessionid={key}"


def test_a_page_whose_session_ended_while_its_socket_was_down_is_told_it_is_signed_out() -> None:
    """Refused at the handshake, the browser would see 1006, not why: the page would retry for good."""
    cookies = ended_session(factories.user("alice"))

    async def scenario() -> None:
        communicator = socket(cookies)
        connected, _ = await communicator.connect()
        assert connected
        assert await communicator.receive_output(timeout=10) == SIGNED_OUT

    async_to_sync(scenario)()


def test_a_page_signed_out_in_its_own_browser_is_told_it_is_signed_out_too() -> None:
    """Signed out in another tab: the browser holds no session cookie any more, only its others."""

    async def scenario() -> None:
        communicator = socket("csrftoken=abc")
        connected, _ = await communicator.connect()
        assert connected
        assert await communicator.receive_output(timeout=10) == SIGNED_OUT

    async_to_sync(scenario)()


def test_a_socket_from_another_origin_is_still_refused_at_the_handshake() -> None:
    cookies = ended_session(factories.user("alice"))

    async def scenario() -> None:
        for origin in ("https://evil.example", f"http://{HOST.split(':')[0]}:9999"):
            connected, _ = await socket(cookies, origin=origin).connect()
            assert not connected

    async_to_sync(scenario)()


def test_a_ping_right_after_an_event_does_not_resync_on_a_counter_read_before_it(monkeypatch) -> None:
    """A ping compares counters this process read up to COUNTERS_MAX_AGE ago: one read before the event the
    socket just heard is behind the socket, not ahead of it. It used to reload the page's whole queue, set the
    socket's number back, and so reload it once more at the next event (a 'gap' that was none)."""
    monkeypatch.setattr(consumers, "COUNTERS_MAX_AGE", 30.0)  # the read before the event serves the ping
    alice = factories.user("alice")
    release = factories.team(f"release-{uuid.uuid4().hex[:8]}", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    cookies = f"sessionid={session_of(alice)}"

    def opened() -> Any:
        ir = factories.open_round(factories.call(deploy), team_=release).input_requests.get()
        broadcast.queue_changed("round.opened", ir.round.call_id, [ir])
        return ir

    async def scenario() -> None:
        communicator = socket(cookies)
        assert (await communicator.connect())[0]
        assert (await communicator.receive_json_from(timeout=10))["type"] == "hello"
        await communicator.send_json_to({"type": "ping"})
        assert await communicator.receive_json_from(timeout=10) == {"type": "pong"}

        first = await sync_to_async(opened)()
        assert (await communicator.receive_json_from(timeout=10))["input_requests"] == [str(first.pk)]
        await communicator.send_json_to({"type": "ping"})
        assert await communicator.receive_json_from(timeout=10) == {"type": "pong"}

        second = await sync_to_async(opened)()
        assert (await communicator.receive_json_from(timeout=10))["input_requests"] == [str(second.pk)]
        assert await communicator.receive_nothing(timeout=consumers.GAP_GRACE + 0.5)  # no resync
        await communicator.disconnect()

    async_to_sync(scenario)()
