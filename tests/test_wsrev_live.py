"""Reviewers' live updates: what a socket must not miss (review of consumers and presence)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from approvals import broadcast, consumers
from approvals.models import Membership
from approvals.services import presence
from elicit_hub.asgi import application
from tests import factories

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]

HOST = "127.0.0.1:8000"


def run(test: Callable[[], Awaitable[None]]) -> None:
    async_to_sync(test)()


def session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def socket(session: str) -> WebsocketCommunicator:
    headers = [(b"host", HOST.encode()), (b"origin", f"http://{HOST}".encode())]
    headers.append((b"cookie", f"sessionid={session}".encode()))
    return WebsocketCommunicator(application, "/ws/queue/", headers=headers)


async def connected(communicator: WebsocketCommunicator) -> None:
    ok, _ = await communicator.connect()
    assert ok
    assert (await communicator.receive_json_from(timeout=10))["type"] == "hello"


@pytest.fixture(autouse=True)
def own_channel_layer() -> None:
    channel_layers.backends.clear()  # each test's event loop gets a layer of its own (see test_consumers)


@pytest.fixture
def world() -> dict[str, Any]:
    alice, bob, dave = factories.user("alice"), factories.user("bob"), factories.user("dave")
    reviewer = Membership.Role.REVIEWER
    release = factories.team(f"release-{uuid.uuid4().hex[:8]}", (alice, reviewer), (bob, reviewer))
    Membership.objects.create(team=release, user=dave, role=reviewer)
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    return {
        **{"alice": alice, "bob": bob, "dave": dave, "release": release, "deploy": deploy},
        "as": {user.username: session_cookie(user) for user in (alice, bob, dave)},
    }


def open_request(server: Any, team: Any) -> Any:
    rnd = factories.open_round(factories.call(server, tool="create_deployment"), team_=team)
    return rnd.input_requests.select_related("round__call", "team").get()


async def bob_looking(world: dict[str, Any]) -> tuple[WebsocketCommunicator, Any]:
    """Alice's queue socket, and a new request of her team that Bob's page says he looks at (she was told)."""
    alice = socket(world["as"]["alice"])
    await connected(alice)
    ir = await sync_to_async(open_request)(world["deploy"], world["release"])
    await sync_to_async(presence.presence_touch)(input_request=ir, user=world["bob"])
    message = await alice.receive_json_from(timeout=10)
    assert message["type"] == "presence" and "bob" in message["html"]
    return alice, ir


def test_a_ping_resyncs_a_watched_call_whose_notice_was_lost(world, monkeypatch) -> None:
    """A call page's socket follows the call's sequence: a notice of the call that never reached it (a full
    channel, a Redis that lost the membership) is found by the next ping, as a queue's is, and the page
    reloads the call. It used to answer pong for as long as the call sent nothing more."""
    monkeypatch.setattr(consumers, "COUNTERS_MAX_AGE", 0.0)  # every ping reads the counters afresh

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        call_id = str(ir.round.call_id)
        await alice.send_json_to({"type": "watch_call", "call": call_id})
        assert await alice.receive_json_from(timeout=10) == {"type": "watching", "call": call_id}
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
        # The call's notice takes its number but never reaches the socket.
        group = broadcast.call_group(call_id)
        await sync_to_async(broadcast.next_seq)(group)
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {
            "type": "resync",
            "reason": "counter",
            "groups": [group],
        }
        # Caught up: the next ping is a pong, and the call's next notice arrives in sequence.
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
        call = await sync_to_async(lambda: ir.round.call)()
        await sync_to_async(broadcast.call_changed)(call)
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "call" and message["call"] == call_id
        await alice.disconnect()

    run(scenario)


def test_a_viewer_whose_page_went_silently_is_cleared_from_the_teams_pages(world, monkeypatch) -> None:
    """Bob's laptop closes on the request page: no "I left" is sent and his presence entry lapses. The next
    update of the request's viewers (Dave's page still beating) must tell the team Bob is gone; it used to
    compare with the live entries only, saw no change and said nothing, so Alice's queue showed Bob
    looking at the request for good."""
    now = [1_000_000.0]
    monkeypatch.setattr(presence, "time", SimpleNamespace(time=lambda: now[0]))

    async def scenario() -> None:
        alice, ir = await bob_looking(world)
        now[0] += 5
        await sync_to_async(presence.presence_touch)(input_request=ir, user=world["dave"])
        message = await alice.receive_json_from(timeout=10)
        assert "bob" in message["html"] and "dave" in message["html"]
        # Bob's page stops beating; Dave's goes on past Bob's lapse (and before its own).
        now[0] += presence.PRESENCE_TTL - 2
        await sync_to_async(presence.presence_touch)(input_request=ir, user=world["dave"])
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "presence" and message["input_request"] == str(ir.pk)
        assert "dave" in message["html"] and "bob" not in message["html"]
        assert await sync_to_async(presence.viewers)([ir.pk]) == {str(ir.pk): ["dave"]}
        await alice.disconnect()

    run(scenario)


def test_a_viewer_change_is_read_once_per_process_not_once_per_socket(world, monkeypatch) -> None:
    """A request opened or left changes its viewers; every socket of its team hears it. Each used to ask the
    database whether its user may answer the request (a thousand open queues: a thousand queries, one after
    the other on the consumers' one database thread, for every page opened or closed). The request is read
    once per event; each socket decides on the scope it holds, and one who may not answer hears nothing."""
    from django.db.backends import utils

    statements: list[str] = []
    execute = utils.CursorWrapper._execute  # type: ignore[attr-defined]  # its private hook, every query

    def counting(self: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
        statements.append(sql)
        return execute(self, sql, *args, **kwargs)

    monkeypatch.setattr(utils.CursorWrapper, "_execute", counting)

    async def scenario() -> None:
        alice, bob, dave = (socket(world["as"][name]) for name in ("alice", "bob", "dave"))
        for each in (alice, bob, dave):
            await connected(each)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        statements.clear()
        await sync_to_async(presence.presence_touch)(input_request=ir, user=world["dave"])
        for each in (alice, bob, dave):
            message = await each.receive_json_from(timeout=10)
            assert message["type"] == "presence" and message["input_request"] == str(ir.pk)
        reads = [sql for sql in statements if 'FROM "approvals_inputrequest"' in sql]
        assert len(reads) == 1, reads
        # A request made for Bob alone: its team's group hears of its viewers, only Bob's socket tells.
        mine = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(type(mine).objects.filter(pk=mine.pk).update)(assignee=world["bob"])
        await sync_to_async(presence.presence_touch)(input_request=mine, user=world["bob"])
        message = await bob.receive_json_from(timeout=10)
        assert message["type"] == "presence" and message["input_request"] == str(mine.pk)
        assert await alice.receive_nothing(timeout=0.3)
        assert await dave.receive_nothing(timeout=0.3)
        for each in (alice, bob, dave):
            await each.disconnect()

    run(scenario)


def test_an_unchanged_scope_is_confirmed_by_its_counter_not_read_again_per_socket(world, monkeypatch) -> None:
    """Past SCOPE_TTL every event made every socket read its user's teams again (a query each: a thousand idle
    queues, a thousand queries per event), though the scopes' counter said nothing changed. The counter now
    confirms the scope; once it moves (Bob leaves the team), the scope is read again and Bob hears nothing."""
    from approvals import permissions

    monkeypatch.setattr(consumers, "SCOPE_TTL", 0.0)  # every event finds the scope older than its TTL
    reads: list[str] = []
    scope_of = permissions.scope_of

    def counting(user: Any) -> Any:
        reads.append(user.get_username())
        return scope_of(user)

    monkeypatch.setattr(permissions, "scope_of", counting)

    async def scenario() -> None:
        alice, bob = socket(world["as"]["alice"]), socket(world["as"]["bob"])
        await connected(alice)
        await connected(bob)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        changes = [
            (presence.presence_touch, world["dave"]),
            (presence.presence_touch, world["alice"]),
            (presence.presence_leave, world["dave"]),
        ]
        for change, user in changes:
            await sync_to_async(change)(input_request=ir, user=user)
            for each in (alice, bob):
                assert (await each.receive_json_from(timeout=10))["type"] == "presence"
        assert reads == []
        await sync_to_async(Membership.objects.filter(user=world["bob"]).delete)()
        await sync_to_async(presence.presence_touch)(input_request=ir, user=world["dave"])
        assert (await alice.receive_json_from(timeout=10))["type"] == "presence"
        assert await bob.receive_nothing(timeout=0.5)
        assert "bob" in reads
        await alice.disconnect()
        await bob.disconnect()

    run(scenario)


def test_a_lone_viewer_whose_page_went_silently_is_cleared_by_the_sweep(world, monkeypatch) -> None:
    """Bob alone looks at the request and his laptop closes: no "I left", and nobody else's page beats to
    notice. Alice's queue showed him looking for good; beat's presence sweep now tells the team once his
    entry lapsed, and only then."""
    now = [2_000_000.0]
    monkeypatch.setattr(presence, "time", SimpleNamespace(time=lambda: now[0]))

    async def scenario() -> None:
        alice, ir = await bob_looking(world)
        now[0] += presence.PRESENCE_TTL - 1
        assert await sync_to_async(presence.presence_sweep)() == 0  # not lapsed yet: nothing said
        assert await alice.receive_nothing(timeout=0.5)
        now[0] += 2
        assert await sync_to_async(presence.presence_sweep)() == 1
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "presence" and message["input_request"] == str(ir.pk)
        assert "bob" not in message["html"]
        assert await sync_to_async(presence.presence_sweep)() == 0  # said once
        await alice.disconnect()

    run(scenario)


def test_the_sweep_leaves_a_request_whose_viewer_came_back_and_one_left_with_a_word(
    world, monkeypatch
) -> None:
    now = [3_000_000.0]
    monkeypatch.setattr(presence, "time", SimpleNamespace(time=lambda: now[0]))
    back = open_request(world["deploy"], world["release"])
    left = open_request(world["deploy"], world["release"])
    presence.presence_touch(input_request=back, user=world["bob"])
    presence.presence_touch(input_request=left, user=world["dave"])
    presence.presence_leave(input_request=left, user=world["dave"])  # said so: off the index at once
    now[0] += presence.PRESENCE_TTL - 5
    presence.presence_touch(input_request=back, user=world["bob"])  # still there
    now[0] += 10
    assert presence.presence_sweep() == 0
    assert presence.viewers([back.pk, left.pk]) == {str(back.pk): ["bob"]}
