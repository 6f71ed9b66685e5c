"""A reviewer of both the team a request was made for and the team it escalated to hears each notice once."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from approvals import broadcast
from approvals.models import Membership
from approvals.services import presence
from approvals.services.answers import input_respond
from tests import factories
from tests.test_consumers import connected, open_request, own_channel_layer, run, session_cookie, socket
from tests.test_consumers import unique as unique_slug

__all__ = ["own_channel_layer"]

pytestmark = [pytest.mark.usefixtures("live_db", "own_channel_layer"), pytest.mark.timeout(60)]


@pytest.fixture
def both() -> dict[str, Any]:
    dana, bob = factories.user("dana"), factories.user("bob")
    reviewer = Membership.Role.REVIEWER
    release = factories.team(unique_slug("release"), (dana, reviewer), (bob, reviewer))
    ops = factories.team(unique_slug("ops"), (dana, reviewer))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    return {"dana": dana, "bob": bob, "release": release, "ops": ops, "deploy": deploy}


def escalated_request(world: dict[str, Any]) -> Any:
    ir = open_request(world["deploy"], world["release"])
    type(ir).objects.filter(pk=ir.pk).update(escalation_team=world["ops"])
    return type(ir).objects.select_related("round", "team", "escalation_team").get(pk=ir.pk)


def test_a_reviewer_of_both_teams_gets_each_card_once(both) -> None:
    session = session_cookie(both["dana"])

    async def scenario() -> None:
        dana = socket(session)
        hello = await connected(dana)
        assert hello["groups"] == sorted(
            broadcast.team_group(team.slug) for team in (both["release"], both["ops"])
        )
        ir = await sync_to_async(escalated_request)(both)
        await sync_to_async(broadcast.input_escalated)(ir)
        card = await dana.receive_json_from(timeout=10)
        assert card["type"] == "card" and card["event"] == "round.opened"
        assert card["input_requests"] == [str(ir.pk)]
        assert await dana.receive_nothing(timeout=0.5)  # not the same card again, from the other team

        await sync_to_async(presence.presence_touch)(input_request=ir, user=both["bob"])
        message = await dana.receive_json_from(timeout=10)
        assert message["type"] == "presence" and "bob" in message["html"]
        assert await dana.receive_nothing(timeout=0.5)

        await sync_to_async(input_respond)(
            input_request_id=ir.pk, user=both["bob"], action="decline", reason="not today"
        )
        card = await dana.receive_json_from(timeout=10)
        assert card["type"] == "card" and card["event"] == "input.answered"
        # The page announced "decided" once per card it got: twice for one decision.
        assert await dana.receive_nothing(timeout=0.5)
        await dana.disconnect()

    run(scenario)
