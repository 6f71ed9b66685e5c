"""What a queue socket says of who looks at a request is who looks at it now, whatever order the notices of
two changes made at once came in."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from approvals import broadcast
from approvals.models import Membership
from approvals.services import presence
from tests import factories
from tests.test_consumers import connected, open_request, own_channel_layer, run, session_cookie, socket
from tests.test_consumers import unique as unique_slug

__all__ = ["own_channel_layer"]

pytestmark = [pytest.mark.usefixtures("live_db", "own_channel_layer"), pytest.mark.timeout(60)]


@pytest.fixture
def team() -> dict[str, Any]:
    ann, ben, cat = factories.user("ann"), factories.user("ben"), factories.user("cat")
    reviewer = Membership.Role.REVIEWER
    release = factories.team(unique_slug("release"), (ann, reviewer), (ben, reviewer), (cat, reviewer))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    return {"ann": ann, "ben": ben, "cat": cat, "release": release, "deploy": deploy}


def test_crossed_presence_notices_leave_the_viewers_as_they_are(team) -> None:
    session = session_cookie(team["cat"])

    async def scenario() -> None:
        cat = socket(session)
        await connected(cat)
        ir = await sync_to_async(open_request)(team["deploy"], team["release"])
        await sync_to_async(presence.presence_touch)(input_request=ir, user=team["ann"])
        assert "ann" in (await cat.receive_json_from(timeout=10))["html"]
        await sync_to_async(presence.presence_touch)(input_request=ir, user=team["ben"])
        assert "ann, ben" in (await cat.receive_json_from(timeout=10))["html"]
        # Ann's and Ben's pages opened at once: Ben's change (ann, ben) took its number first, then Ann's
        # notice, as her change left the set (ann alone), came after it.
        await sync_to_async(broadcast.presence_changed)(ir, ["ann"])
        message = await cat.receive_json_from(timeout=10)
        assert message["type"] == "presence" and message["input_request"] == str(ir.pk)
        assert "ann, ben" in message["html"]  # not "ann" alone until someone's page changes the set again
        await sync_to_async(presence.presence_leave)(input_request=ir, user=team["ben"])
        message = await cat.receive_json_from(timeout=10)
        assert "ann" in message["html"] and "ben" not in message["html"]
        await cat.disconnect()

    run(scenario)
