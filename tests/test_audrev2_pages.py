"""The audit pages as an auditor reads them: the call timeline names the clock its times are on, and a list
row holds an excerpt of a long message, the timeline the whole of it."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit.core import Actor
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


def test_the_timeline_names_the_zone_its_times_are_on(root: Client) -> None:
    call = factories.call(factories.server("deploy"), factories.agent("ci-bot")[0])
    event = audit.record(actor=Actor.system(), verb="call.completed", call=call, data={"is_error": False})
    root.cookies["tz"] = "Asia/Kolkata"
    body = root.get(reverse("audit:call_timeline", args=[call.pk])).content.decode()
    assert event.at.astimezone(ZoneInfo("Asia/Kolkata")).strftime("%Y-%m-%d %H:%M:%S") in body
    assert "Asia/Kolkata" in body


def test_a_long_message_is_an_excerpt_in_the_list_that_opens_to_the_whole(root: Client) -> None:
    message = "Deploy checkout? " + "x" * 3000 + " the end"
    event = audit.record(
        actor=Actor.system(), verb="server.tools_refreshed", data={"message": message, "n": 1}
    )
    short = audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"message": "Short one"})
    body = root.get(reverse("audit:index")).content.decode()
    row = body[body.index(f'id="event-{event.id}"') :]
    row = row[: row.index("</tr>")]
    cell = row[row.index('class="summary"') :]
    assert "<details" in cell and "<summary" in cell
    excerpt = cell[cell.index("<summary") : cell.index("</summary>")]
    assert "Deploy checkout?" in excerpt and "the end" not in excerpt and len(excerpt) < 400
    assert "the end" in cell  # the whole message, one click away
    short_row = body[body.index(f'id="event-{short.id}"') :]
    assert "<details" not in short_row[: short_row.index("</tr>")]
