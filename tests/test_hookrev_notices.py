"""Team notices reach every address a team lists, however it lists them; say when a server that asked on an
open session stops waiting; and a server's text in a chat notice mentions no one. Discord (which takes Slack's
payload on its ``/slack`` endpoint) pings the whole channel for ``@everyone`` or ``@here`` wherever it stands,
in the middle of a word too, not only where an ``@`` starts one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from approvals.models import Notification, Round, Team
from approvals.services import notifications
from tests import factories
from tests.test_notifications import notices, pending_request


def test_a_mass_mention_inside_a_word_is_kept_from_pinging_the_channel() -> None:
    text = notifications._chat_text("deploy@everyone then ops.@here and x_@Everyone")
    assert "@everyone" not in text.lower() and "@here" not in text.lower()
    assert text.replace("\u2060", "") == "deploy@everyone then ops.@here and x_@Everyone"


def test_an_email_address_in_a_notice_is_left_as_written() -> None:
    assert notifications._chat_text("mail ana@example.org or ops@deploy.example") == (
        "mail ana@example.org or ops@deploy.example"
    )


@pytest.mark.django_db
def test_an_email_notice_reaches_addresses_written_one_a_line() -> None:
    """The admin's field for the addresses is a text area: one a line is how most people fill it in."""
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(
        notify_emails="ana@example.org\r\nben@example.org\n\ncy@example.org"
    )
    team.refresh_from_db()
    notifications.notify(ir=pending_request(team), team=team, event="routed")
    (notice,) = notices(team, "routed")

    assert notifications.notification_send(notification_id=notice.pk) is None

    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT, notice.last_error
    (message,) = mail.outbox
    assert message.to == ["ana@example.org", "ben@example.org", "cy@example.org"]


@pytest.mark.django_db
def test_a_team_whose_addresses_are_only_separators_gets_no_email_notice() -> None:
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails=" ;, \n")
    team.refresh_from_db()
    notifications.notify(ir=pending_request(team), team=team, event="routed")
    assert notices(team, "routed") == []


@pytest.mark.django_db
def test_a_notice_of_a_question_a_server_waits_on_says_when_the_server_stops_waiting() -> None:
    """A server asking on an open session waits its own while (a minute by default), however long the hub's
    deadline: the team must not read only the later one and answer after the request is gone."""
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ops@example.org")
    team.refresh_from_db()
    ir = pending_request(team, deadline_in=timedelta(hours=1))
    waits_until = timezone.now() + timedelta(seconds=60)
    Round.objects.filter(pk=ir.round_id).update(kind=Round.Kind.PUSH, server_deadline=waits_until)
    notifications.notify(ir=ir, team=team, event="routed")
    (notice,) = notices(team, "routed")

    assert notifications.notification_send(notification_id=notice.pk) is None

    (message,) = mail.outbox
    assert f"The server waits until: {waits_until.isoformat()}" in message.body
    assert "Deadline: " in message.body
