"""A url-mode request made for one person (its assignee: the person the agent acts for) reaches that
person's open queue live, whether or not they review for the request's team; and only once when they do."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from approvals.services.answers import input_respond
from tests import test_consumers
from tests.test_consumers import (  # noqa: F401  (fixtures: used by name)
    FORM,
    LINK,
    connected,
    opened,
    own_channel_layer,
    run,
    socket,
)

world = test_consumers.world  # the fixture, by its name

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]


def test_a_link_made_for_someone_outside_the_team_reaches_their_open_queue(world) -> None:
    async def scenario() -> None:
        # carol reviews for ops only; the agent acts for her on the release team's server.
        carol, alice = socket(world["as"]["carol"]), socket(world["as"]["alice"])
        await connected(carol)
        await connected(alice)
        rnd = await sync_to_async(opened)(
            world["deploy"], {"login": LINK, "environment": FORM}, on_behalf_of=world["carol"]
        )
        by_key = await sync_to_async(lambda: {ir.key: ir for ir in rnd.input_requests.all()})()
        link = by_key["login"]
        assert link.assignee_id == world["carol"].pk and link.team_id == world["release"].pk

        card = await carol.receive_json_from(timeout=10)
        assert card["type"] == "card" and card["event"] == "round.opened"
        assert card["input_requests"] == [str(link.pk)]
        assert "Sign in to the registry" in card["html"] and "Pick the environment" not in card["html"]
        assert await carol.receive_nothing(timeout=0.5)

        # The team sees its own request and never carol's link.
        team_card = await alice.receive_json_from(timeout=10)
        assert team_card["input_requests"] == [str(by_key["environment"].pk)]
        assert "Sign in to the registry" not in team_card["html"]

        # Her answer (an agent cancelling, another tab) reaches her open page as a decision.
        await sync_to_async(input_respond)(input_request_id=link.pk, user=world["carol"], action="decline")
        decided = await carol.receive_json_from(timeout=10)
        assert decided["event"] == "input.answered" and str(link.pk) in decided["decided"]
        await carol.disconnect()
        await alice.disconnect()

    run(scenario)


def test_an_assignee_in_the_team_gets_each_notice_once(world) -> None:
    async def scenario() -> None:
        bob = socket(world["as"]["bob"])
        await connected(bob)
        rnd = await sync_to_async(opened)(world["deploy"], {"login": LINK}, on_behalf_of=world["bob"])
        ir = await sync_to_async(rnd.input_requests.get)()
        card = await bob.receive_json_from(timeout=10)
        assert card["input_requests"] == [str(ir.pk)]
        assert await bob.receive_nothing(timeout=0.5)
        await bob.disconnect()

    run(scenario)
