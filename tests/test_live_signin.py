"""An open queue socket follows its user's sign-in: signed out, deactivated, demoted or removed from a team
while a tab is open, it stops receiving (and the page drops what it was sent before)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from approvals import broadcast, consumers
from approvals.models import Membership
from tests import factories, test_consumers
from tests.test_consumers import (  # noqa: F401  (fixtures: used by name)
    connected,
    open_request,
    own_channel_layer,
    run,
    session_cookie,
    socket,
)

world = test_consumers.world  # the fixture, by its name

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]

SIGNED_OUT = {"type": "websocket.close", "code": 4401}


@pytest.fixture(autouse=True)
def scope_read_at_every_event(monkeypatch) -> None:
    # Time travel: a socket's scope (normally trusted for SCOPE_TTL seconds as read) is old at once.
    monkeypatch.setattr(consumers, "SCOPE_TTL", 0.0)
    monkeypatch.setattr(consumers, "COUNTERS_MAX_AGE", 0.0)


async def opened_for(world: dict[str, Any]) -> Any:
    ir = await sync_to_async(open_request)(world["deploy"], world["release"])
    await sync_to_async(broadcast.queue_changed)("round.opened", ir.round.call_id, [ir])
    return ir


async def first_card(communicator: WebsocketCommunicator, world: dict[str, Any]) -> None:
    ir = await opened_for(world)
    card = await communicator.receive_json_from(timeout=10)
    assert card["type"] == "card" and card["input_requests"] == [str(ir.pk)]


def test_a_deactivated_reviewers_socket_gets_no_more_cards_and_is_closed(world) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        await first_card(alice, world)

        user = world["alice"]
        user.is_active = False
        await sync_to_async(user.save)()
        await opened_for(world)
        assert await alice.receive_output(timeout=10) == SIGNED_OUT
        await alice.disconnect()

    run(scenario)


def test_a_reviewer_who_signed_out_elsewhere_is_closed_at_the_next_ping(world) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_json_from(timeout=10) == {"type": "pong"}

        browser = Client()
        browser.cookies["sessionid"] = world["as"]["alice"]
        response = await sync_to_async(browser.post)("/accounts/logout/")
        assert response.status_code == 302
        await alice.send_json_to({"type": "ping"})
        assert await alice.receive_output(timeout=10) == SIGNED_OUT
        await alice.disconnect()

    run(scenario)


def test_a_password_change_signs_the_open_socket_out(world) -> None:
    async def scenario() -> None:
        alice = socket(world["as"]["alice"])
        await connected(alice)
        await first_card(alice, world)

        user = world["alice"]
        user.set_password("a new one")
        await sync_to_async(user.save)()
        await opened_for(world)
        assert await alice.receive_output(timeout=10) == SIGNED_OUT
        await alice.disconnect()

    run(scenario)


def test_a_superuser_demoted_while_connected_gets_no_other_teams_cards(world) -> None:
    async def scenario() -> None:
        root = await sync_to_async(factories.user)("root", is_superuser=True, is_staff=True)
        session = await sync_to_async(session_cookie)(root)
        tab = socket(session)
        await connected(tab)
        await first_card(tab, world)  # not a member of the team: seen as a superuser

        root.is_superuser = root.is_staff = False
        await sync_to_async(root.save)()
        await opened_for(world)
        assert await tab.receive_nothing(timeout=0.5)
        await tab.disconnect()

    run(scenario)


def test_a_removed_member_is_told_to_reload_what_the_page_shows(world) -> None:
    """Cards already on the page stay there until it reloads its queue: the next ping after the removal
    tells it to, and the socket leaves the team's group."""

    async def scenario() -> None:
        bob = socket(world["as"]["bob"])
        hello = await connected(bob)
        group = broadcast.team_group(world["release"].slug)
        assert hello["groups"] == [group]
        await first_card(bob, world)

        await sync_to_async(Membership.objects.filter(user=world["bob"]).delete)()
        await bob.send_json_to({"type": "ping"})
        assert await bob.receive_json_from(timeout=10) == {
            "type": "resync",
            "reason": "scope",
            "groups": [group],
        }
        await bob.send_json_to({"type": "ping"})
        assert await bob.receive_json_from(timeout=10) == {"type": "pong"}
        await bob.disconnect()

    run(scenario)


def test_a_last_login_elsewhere_moves_no_ones_scope(world) -> None:
    """Every sign-in saves the user's last_login: that alone must not make every open socket read again."""
    before = broadcast.scopes_version()
    Client().login(username="carol", password="pw-carol")
    assert broadcast.scopes_version() == before
    user = world["carol"]
    user.is_active = False
    user.save()
    assert broadcast.scopes_version() != before
