"""The queue websocket, driven through the real ASGI app (origin check, session auth) and the real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.core.cache import cache
from django.test import Client
from redis.exceptions import RedisError

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


def socket(
    session: str | None = None, origin: str = f"http://{HOST}", language: str = ""
) -> WebsocketCommunicator:
    headers = [(b"host", HOST.encode())]
    if origin:
        headers.append((b"origin", origin.encode()))
    if language:
        headers.append((b"accept-language", language.encode()))
    if session is not None:
        headers.append((b"cookie", f"sessionid={session}".encode()))
    return WebsocketCommunicator(application, "/ws/queue/", headers=headers)


def unique(prefix: str) -> str:
    # Group names live in the shared Redis: unique slugs keep parallel test runs out of each other's way.
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def own_channel_layer() -> None:
    """Each test runs in an event loop of its own (`run`), and channels-redis's layer serves its receives on
    one loop: a receive an earlier test's loop left behind (a long-poll's, a socket's) holds the layer's
    receive lock in a loop that is gone. A web process has one loop; here each test gets its own layer."""
    channel_layers.backends.clear()


@pytest.fixture
def world() -> dict[str, Any]:
    alice, bob, carol = factories.user("alice"), factories.user("bob"), factories.user("carol")
    reviewer = Membership.Role.REVIEWER
    release = factories.team(unique("release"), (alice, reviewer), (bob, reviewer))
    ops = factories.team(unique("ops"), (carol, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    pager = factories.server("pager", name="Pager", default_team=ops)
    return {
        **{"alice": alice, "bob": bob, "carol": carol, "release": release, "ops": ops},
        **{"deploy": deploy, "pager": pager},
        "as": {user.username: session_cookie(user) for user in (alice, bob, carol)},
    }


def open_request(server: Any, team: Any, tool: str = "create_deployment") -> Any:
    rnd = factories.open_round(factories.call(server, tool=tool), team_=team)
    return rnd.input_requests.select_related("round__call", "team").get()


async def notice_by_hand(team: Any, call_id: Any, ids: list[str], round_id: int | None = None) -> None:
    """A ``round.opened`` notice to the team's group, next in its sequence, as broadcast sends one but
    without a card; ``round_id`` is left out when None."""
    group = broadcast.team_group(team.slug)
    event: dict[str, Any] = {
        "type": "queue.changed",
        "event": "round.opened",
        "call": str(call_id),
        "input_requests": ids,
        "group": group,
        "seq": await sync_to_async(broadcast.next_seq)(group),
    }
    if round_id is not None:
        event["round"] = round_id
    await get_channel_layer().group_send(group, event)


async def connected(communicator: WebsocketCommunicator) -> dict[str, Any]:
    ok, _ = await communicator.connect()
    assert ok
    hello = await communicator.receive_json_from(timeout=10)
    assert hello["type"] == "hello"
    return hello


def test_an_anonymous_socket_is_refused() -> None:
    async def scenario() -> None:
        ok, _ = await socket(None).connect()
        assert not ok

    run(scenario)


def test_a_foreign_origin_is_refused(world) -> None:
    async def scenario() -> None:
        ok, _ = await socket(world["as"]["alice"], origin="https://evil.example").connect()
        assert not ok
        # Same host name, another port: the host validator lets it through, the consumer does not.
        ok, _ = await socket(world["as"]["alice"], origin="http://127.0.0.1:9999").connect()
        assert not ok
        ok, _ = await socket(world["as"]["alice"], origin="").connect()
        assert not ok

    run(scenario)


def test_a_reviewer_joins_only_their_teams_and_gets_their_rounds_as_rendered_cards(world) -> None:
    async def scenario() -> None:
        alice, carol = socket(world["as"]["alice"]), socket(world["as"]["carol"])
        assert (await connected(alice))["groups"] == [broadcast.team_group(world["release"].slug)]
        assert (await connected(carol))["groups"] == [broadcast.team_group(world["ops"].slug)]

        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])

        card = await alice.receive_json_from(timeout=10)
        assert card["type"] == "card"
        assert card["event"] == "round.opened"
        assert card["input_requests"] == [str(ir.pk)]
        assert card["pending"] == 1
        assert card["decided"] == {}
        assert f'id="round-{ir.round_id}"' in card["html"]
        assert "Deploy bot" in card["html"] and "create_deployment" in card["html"]
        assert "opaque-state" not in card["html"]  # requestState never reaches a browser
        assert await carol.receive_nothing(timeout=0.3)
        await alice.disconnect()
        await carol.disconnect()

    run(scenario)


def test_permission_is_checked_again_for_every_event(world) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        foreign = await sync_to_async(open_request)(world["pager"], world["ops"])
        # A (mis)routed event naming another team's request, sent to alice's group: she learns nothing.
        await notice_by_hand(world["release"], foreign.round.call_id, [str(foreign.pk)])
        assert await alice.receive_nothing(timeout=0.5)
        await alice.disconnect()

    run(scenario)


def test_an_answer_elsewhere_sends_the_decision_as_a_fragment(world) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        from approvals.services.answers import input_respond

        await sync_to_async(input_respond)(
            input_request_id=ir.pk, user=world["bob"], action="decline", reason="not today"
        )
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "card" and message["event"] == "input.answered"
        assert message["pending"] == 0
        assert "Declined by <bdi>bob</bdi>" in message["decided"][str(ir.pk)]
        assert "not today" in message["decided"][str(ir.pk)]
        await alice.disconnect()

    run(scenario)


def test_a_sequence_gap_triggers_a_resync(world) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        group = broadcast.team_group(world["release"].slug)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(broadcast.next_seq)(group)  # a message that never arrived
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
        assert (await alice.receive_json_from(timeout=10))["type"] == "card"  # the event itself arrives
        # The missing one is given GAP_GRACE to arrive late; then the page is told to resync.
        started = time.monotonic()
        assert await alice.receive_json_from(timeout=10) == {
            "type": "resync",
            "reason": "gap",
            "groups": [group],
        }
        assert time.monotonic() - started >= consumers.GAP_GRACE * 0.5
        # Back in step: the next event is plain.
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
        assert (await alice.receive_json_from(timeout=10))["type"] == "card"
        await alice.disconnect()

    run(scenario)


def test_notices_from_two_processes_crossing_on_the_way_are_no_gap(world) -> None:
    """The worker takes number n and the web process n + 1, and the web process's notice arrives first: the
    late one fills its place and no resync reloads the page."""

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        group = broadcast.team_group(world["release"].slug)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        late = await sync_to_async(broadcast.next_seq)(group)  # taken, not yet sent
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])  # late + 1
        assert (await alice.receive_json_from(timeout=10))["type"] == "card"
        event = {
            "type": "queue.changed",
            "event": "input.answered",
            "call": str(ir.round.call_id),
            "input_requests": [str(ir.pk)],
            "round": ir.round_id,
            "group": group,
            "seq": late,
        }
        await get_channel_layer().group_send(group, event)
        assert (await alice.receive_json_from(timeout=10))["type"] == "card"
        assert await alice.receive_nothing(timeout=consumers.GAP_GRACE + 0.5)  # no resync
        await alice.disconnect()

    run(scenario)


def test_a_ping_finds_a_counter_that_moved_while_nothing_arrived(world, monkeypatch) -> None:
    from approvals import consumers

    monkeypatch.setattr(consumers, "COUNTERS_MAX_AGE", 0.2)

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
        group = broadcast.team_group(world["release"].slug)
        # Redis restarted: the counter and the group membership are gone.
        await sync_to_async(cache.delete)(f"broadcast-seq:{group}")
        layer = get_channel_layer()
        await layer.connection(layer.consistent_hash(group)).delete(layer._group_key(group))
        await sync_to_async(broadcast.next_seq)(group)
        await asyncio.sleep(0.3)  # past the counters this process read for the last ping
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {
            "type": "resync",
            "reason": "counter",
            "groups": [group],
        }
        # The ping joined the group again: the next event arrives, in sequence.
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
        card = await alice.receive_json_from(timeout=10)
        assert card["type"] == "card" and card["input_requests"] == [str(ir.pk)]
        await alice.disconnect()

    run(scenario)


def test_pings_between_rejoins_read_no_database(world, monkeypatch) -> None:
    """An open tab pings every 10 s; a thousand of them must not each query the database (bench/sockets.py
    measured a third of a core). Only every REJOIN_EVERY seconds does a ping read the user's teams again."""
    from approvals import consumers

    reads: list[str] = []
    allowed_groups = consumers.QueueConsumer._allowed_groups

    def counting(self: Any) -> list[str]:
        reads.append(self.user.username)
        return allowed_groups(self)

    monkeypatch.setattr(consumers.QueueConsumer, "_allowed_groups", counting)

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        assert reads == ["alice"]
        for _ in range(5):
            await alice.send_json_to({"type": "ping"})
            assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
        assert reads == ["alice"]
        # Alice joins the ops team; once REJOIN_EVERY has passed her next ping joins its group too.
        await sync_to_async(Membership.objects.create)(
            team=world["ops"], user=world["alice"], role=Membership.Role.REVIEWER
        )
        monkeypatch.setattr(consumers, "REJOIN_EVERY", 0.0)
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {"type": "pong"}
        assert reads == ["alice", "alice"]
        ir = await sync_to_async(open_request)(world["pager"], world["ops"])
        await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
        card = await alice.receive_json_from(timeout=10)
        assert card["type"] == "card" and card["input_requests"] == [str(ir.pk)]
        await alice.disconnect()

    run(scenario)


def test_presence_reaches_teammates_but_not_other_teams(world) -> None:
    async def scenario() -> None:
        alice, carol = socket(world["as"]["alice"]), socket(world["as"]["carol"])
        await connected(alice)
        await connected(carol)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(presence.presence_touch)(input_request=ir, user=world["bob"])
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "presence" and message["input_request"] == str(ir.pk)
        assert "bob" in message["html"]
        assert await carol.receive_nothing(timeout=0.3)
        await alice.disconnect()
        await carol.disconnect()

    run(scenario)


def test_a_call_page_is_watched_only_when_the_user_may_see_the_call(world) -> None:
    async def scenario() -> None:
        carol = socket(world["as"]["carol"])
        await connected(carol)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        call_id = str(ir.round.call_id)
        await carol.send_json_to({"type": "watch_call", "call": call_id})
        assert await carol.receive_json_from(timeout=10) == {"type": "refused", "call": call_id}

        alice = socket(world["as"]["alice"])
        await connected(alice)
        await alice.send_json_to({"type": "watch_call", "call": call_id})
        assert await alice.receive_json_from(timeout=10) == {"type": "watching", "call": call_id}
        await sync_to_async(broadcast.call_changed)(ir.round.call)
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "call" and message["call"] == call_id
        assert "Rounds and answers" in message["html"]
        await alice.disconnect()
        await carol.disconnect()

    run(scenario)


def test_a_removed_member_stops_receiving_on_an_open_socket(world, monkeypatch) -> None:
    from approvals import consumers

    # Time travel: the socket's permission scope (normally re-read every SCOPE_TTL seconds) is stale at once.
    monkeypatch.setattr(consumers, "SCOPE_TTL", 0.0)

    async def scenario() -> None:
        bob = socket(world["as"]["bob"])
        await connected(bob)
        first = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(broadcast.queue_changed)("round.opened", first.round.call_id, [first])
        assert (await bob.receive_json_from(timeout=10))["input_requests"] == [str(first.pk)]

        await sync_to_async(Membership.objects.filter(user=world["bob"]).delete)()
        second = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(broadcast.queue_changed)("round.opened", second.round.call_id, [second])
        assert await bob.receive_nothing(timeout=0.5)
        await bob.disconnect()

    run(scenario)


def test_an_escalated_request_reaches_the_fallback_teams_socket(world) -> None:
    async def scenario() -> None:
        carol = socket(world["as"]["carol"])
        await connected(carol)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        await sync_to_async(type(ir).objects.filter(pk=ir.pk).update)(escalation_team=world["ops"])
        escalated = await sync_to_async(
            type(ir).objects.select_related("round", "team", "escalation_team").get
        )(pk=ir.pk)
        await sync_to_async(broadcast.input_escalated)(escalated)
        card = await carol.receive_json_from(timeout=10)
        assert card["type"] == "card" and card["input_requests"] == [str(ir.pk)]
        await carol.disconnect()

    run(scenario)


def test_a_watched_calls_counter_that_expired_resyncs_the_call_page(world) -> None:
    """A call's counter expires a day after its last notice (`broadcast.CALL_SEQ_TTL`): a page still
    watching it then gets the next notice numbered from 1, asks for a resync of the call, and is redrawn."""

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        call = ir.round.call
        group = broadcast.call_group(call.pk)
        await sync_to_async(broadcast.next_seq)(group)
        await sync_to_async(broadcast.next_seq)(group)  # the call's counter is at 2
        await alice.send_json_to({"type": "watch_call", "call": str(call.pk)})
        assert await alice.receive_json_from(timeout=10) == {"type": "watching", "call": str(call.pk)}

        await sync_to_async(cache.delete)(f"broadcast-seq:{group}")  # what its expiry does
        await sync_to_async(broadcast.call_changed)(call)
        assert await alice.receive_json_from(timeout=10) == {
            "type": "resync",
            "reason": "gap",
            "groups": [group],
        }
        message = await alice.receive_json_from(timeout=10)
        assert message["type"] == "call" and message["call"] == str(call.pk)
        # From there on the call's notices are in sequence again: no second resync.
        await sync_to_async(broadcast.call_changed)(call)
        assert (await alice.receive_json_from(timeout=10))["type"] == "call"
        await alice.disconnect()

    run(scenario)


def test_progress_redraws_the_watched_call_page_and_the_queue_card(world) -> None:
    from approvals.models import ToolCall
    from approvals.services import sending

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        # A tool still running while it asks (a pushed question): its card is in the queue.
        ir = await sync_to_async(open_request)(world["deploy"], world["release"])
        call_id = str(ir.round.call_id)
        await sync_to_async(ToolCall.objects.filter(pk=call_id).update)(status=ToolCall.Status.RUNNING)
        await alice.send_json_to({"type": "watch_call", "call": call_id})
        assert await alice.receive_json_from(timeout=10) == {"type": "watching", "call": call_id}

        progress = {"progress": 3, "total": 8, "message": "copying \u202efiles", "at": "2026-01-01T00:00:00Z"}
        assert await sync_to_async(sending.call_progress)(call_id=call_id, progress=progress)
        messages = [await alice.receive_json_from(timeout=10) for _ in range(2)]
        by_type = {m["type"]: m for m in messages}
        assert set(by_type) == {"call", "card"}
        for html in (by_type["call"]["html"], by_type["card"]["html"]):
            assert 'value="3" max="8"' in html and "3 of 8" in html
            assert "\u202e" not in html and "copying" in html  # server text is revealed, never raw
        assert by_type["card"]["event"] == "call.progress"
        await alice.disconnect()

    run(scenario)


def test_progress_after_the_call_ended_is_dropped(world) -> None:
    from approvals.models import ToolCall
    from approvals.services import sending

    call = factories.call(world["deploy"], status=ToolCall.Status.COMPLETED, result={"content": []})
    late = {"progress": 1, "total": 1, "message": None, "at": "2026-01-01T00:00:00Z"}
    assert sending.call_progress(call_id=call.pk, progress=late) is False
    call.refresh_from_db()
    assert call.progress is None


# --- a round that opens: its card travels in the notice (approvals.cards)

FORM = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Pick the environment",
        "requestedSchema": factories.ENVIRONMENT_SCHEMA,
    },
}
LINK = {
    "method": "elicitation/create",
    "params": {
        "mode": "url",
        "message": "Sign in to the registry",
        "url": "https://registry.example/sign-in",
    },
}


def opened(server: Any, requests: dict[str, Any], **call: Any) -> Any:
    """A round opened as the worker opens one (its notice is sent when the transaction commits)."""
    from django.db import transaction
    from django.utils import timezone

    from approvals.services.rounds import round_open

    tool_call = factories.call(server, **call)
    with transaction.atomic():
        return round_open(
            call=tool_call,
            input_requests=requests,
            raw={"resultType": "input_required"},
            request_state="opaque-state",
            received_at=timezone.now(),
        )


@pytest.fixture
def card_reads(monkeypatch) -> list[list[str]]:
    """The rounds the sockets' process read again to build a card (the round's own process renders it once
    for the notice: that one is not counted)."""
    reads: list[list[str]] = []
    load = consumers._load_card

    def counting(ids: list[str], round_id: int | None = None) -> Any:
        reads.append(ids)
        return load(ids, round_id)

    monkeypatch.setattr(consumers, "_load_card", counting)
    return reads


def test_a_round_that_opens_reaches_the_socket_as_rendered_with_its_notice(world, card_reads) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        rnd = await sync_to_async(opened)(world["deploy"], {"environment": FORM})
        ir = await sync_to_async(rnd.input_requests.get)()
        card = await alice.receive_json_from(timeout=10)
        assert card_reads == []  # sent as the notice carried it: no read, no rendering here
        assert card["type"] == "card" and card["event"] == "round.opened"
        assert card["input_requests"] == [str(ir.pk)] and card["pending"] == 1 and card["decided"] == {}
        assert card["round"] == rnd.pk and card["call"] == str(rnd.call_id)
        assert f'id="round-{rnd.pk}"' in card["html"] and "Pick the environment" in card["html"]
        assert "opaque-state" not in card["html"]

        # The same notice without its card: the socket reads the round and renders the very same card.
        await notice_by_hand(world["release"], rnd.call_id, [str(ir.pk)], round_id=rnd.pk)
        again = await alice.receive_json_from(timeout=10)
        assert card_reads == [[str(ir.pk)]]
        assert {**again, "seq": None} == {**card, "seq": None}
        await alice.disconnect()

    run(scenario)


def test_a_card_in_another_language_is_rendered_by_the_sockets_process(world, card_reads) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"], language="de")
        await connected(alice)
        rnd = await sync_to_async(opened)(world["deploy"], {"environment": FORM})
        card = await alice.receive_json_from(timeout=10)
        assert card["type"] == "card" and len(card_reads) == 1
        deadline = await sync_to_async(lambda: rnd.deadline)()
        from django.utils import formats, translation

        with translation.override("de"):
            shown = formats.date_format(deadline.astimezone(), "DATETIME_FORMAT")
        assert shown in card["html"]
        await alice.disconnect()

    run(scenario)


def test_a_card_only_its_assignee_may_answer_reaches_only_them(world, card_reads) -> None:
    async def scenario() -> None:
        alice, bob = socket(world["as"]["alice"]), socket(world["as"]["bob"])
        await connected(alice)
        await connected(bob)
        # A url-mode request made for the person the call acts for: bob alone answers it.
        rnd = await sync_to_async(opened)(world["deploy"], {"login": LINK}, on_behalf_of=world["bob"])
        ir = await sync_to_async(rnd.input_requests.get)()
        assert ir.assignee_id == world["bob"].pk
        card = await bob.receive_json_from(timeout=10)
        assert card["input_requests"] == [str(ir.pk)] and "Sign in to the registry" in card["html"]
        assert await alice.receive_nothing(timeout=0.5)
        assert card_reads == []
        await alice.disconnect()
        await bob.disconnect()

    run(scenario)


def test_a_card_the_user_sees_only_part_of_is_read_again_for_them(world, card_reads) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        rnd = await sync_to_async(opened)(
            world["deploy"], {"environment": FORM, "login": LINK}, on_behalf_of=world["bob"]
        )
        by_key = await sync_to_async(lambda: {ir.key: ir for ir in rnd.input_requests.all()})()
        card = await alice.receive_json_from(timeout=10)
        assert card["input_requests"] == [str(by_key["environment"].pk)]
        assert str(by_key["login"].pk) not in card["html"] and "Sign in to the registry" not in card["html"]
        assert "Pick the environment" in card["html"]
        assert len(card_reads) == 1
        await alice.disconnect()

    run(scenario)


def test_a_removed_member_gets_no_card_from_a_notice(world, monkeypatch, card_reads) -> None:
    # The scope is confirmed by the scopes' counter at every event (normally it serves SCOPE_TTL as read).
    monkeypatch.setattr(consumers, "SCOPE_TTL", 0.0)

    async def scenario() -> None:
        bob = socket(world["as"]["bob"])
        await connected(bob)
        await sync_to_async(opened)(world["deploy"], {"environment": FORM})
        assert (await bob.receive_json_from(timeout=10))["type"] == "card"
        assert card_reads == []  # the scope read on connecting still holds: the counter has not moved

        await sync_to_async(Membership.objects.filter(user=world["bob"]).delete)()
        await sync_to_async(opened)(world["deploy"], {"environment": FORM})
        assert await bob.receive_nothing(timeout=0.5)
        assert len(card_reads) == 1  # the counter moved: the scope was read again, as the card was
        await bob.disconnect()

    run(scenario)


def test_a_scope_past_its_longest_life_is_read_again_though_the_counter_did_not_move(
    world, monkeypatch, card_reads
) -> None:
    """A change the counter missed (an UPDATE that sent no signal) is seen once the scope is that old."""
    monkeypatch.setattr(consumers, "SCOPE_TTL", 0.0)
    monkeypatch.setattr(consumers, "SCOPE_MAX_AGE", 0.0)

    async def scenario() -> None:
        bob = socket(world["as"]["bob"])
        await connected(bob)
        await sync_to_async(Membership.objects.filter(user=world["bob"]).update)(role=Membership.Role.VIEWER)
        await sync_to_async(opened)(world["deploy"], {"environment": FORM})
        assert await bob.receive_nothing(timeout=0.5)
        assert len(card_reads) == 1
        await bob.disconnect()

    run(scenario)


def test_every_membership_change_moves_the_scopes_counter(world) -> None:
    before = broadcast.scopes_version()
    viewer = Membership.Role.VIEWER
    membership = Membership.objects.create(team=world["ops"], user=world["alice"], role=viewer)
    created = broadcast.scopes_version()
    membership.role = Membership.Role.REVIEWER
    membership.save()
    changed = broadcast.scopes_version()
    world["ops"].delete()  # its memberships go with it
    deleted = broadcast.scopes_version()
    assert len({before, created, changed, deleted}) == 4


def test_a_card_too_large_for_a_notice_is_read_by_the_sockets(world, monkeypatch, card_reads) -> None:
    from approvals import cards

    monkeypatch.setattr(cards, "MAX_PRERENDERED", 100)

    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        rnd = await sync_to_async(opened)(world["deploy"], {"environment": FORM})
        card = await alice.receive_json_from(timeout=10)
        assert card["type"] == "card" and f'id="round-{rnd.pk}"' in card["html"]
        assert len(card_reads) == 1
        await alice.disconnect()

    run(scenario)


def test_a_ping_that_finds_a_counter_moved_while_redis_goes_away_still_resyncs() -> None:
    """Redis answered the counters, then failed as the socket rejoined its groups: the socket is not torn
    down with a traceback; the page is told to resync (it reads over HTTP) and the next ping rejoins."""
    consumer = consumers.QueueConsumer()
    consumer.seqs, consumer._groups_version = {"queue-team-1": 1}, 5
    consumer._joined_at, consumer._session_ends, consumer.signed_out = time.monotonic(), None, False
    sent: list[dict[str, Any]] = []

    async def counters(groups: list[str]) -> dict[str, int]:
        return {"queue-team-1": 2, broadcast.SCOPES: 5}

    async def join() -> list[str]:
        raise RedisError("Connection refused")

    async def send_json(message: dict[str, Any]) -> None:
        sent.append(message)

    consumer._heard = lambda: ["queue-team-1"]  # type: ignore[method-assign]
    consumer._counters = counters  # type: ignore[method-assign]
    consumer._join = join  # type: ignore[method-assign]
    consumer.send_json = send_json  # type: ignore[method-assign]
    asyncio.run(consumer._check_counters())
    assert sent == [{"type": "resync", "reason": "counter", "groups": ["queue-team-1"]}]
