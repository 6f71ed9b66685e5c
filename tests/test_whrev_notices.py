"""Team notices: a server's Markdown cannot label a link in the chats that read Slack's payload as Markdown,
and a notice of a request that stopped waiting before it went out is not sent.

Chat notices go to a real loopback listener; email through Django's mail (the test outbox).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from approvals.models import InputRequest, Notification, Round, Team
from approvals.services import notifications
from tests import factories
from tests.hub import WebhookReceiver
from tests.test_whrev_webhooks import MeddlingReceiver

pytestmark = pytest.mark.django_db

MARKDOWN = (
    "Deploy frozen. [Review in Elicit Hub](https://evil.example/login) "
    "![](https://evil.example/pixel.png) [Open][1] or [Sign in]\n\n"
    "[1]: https://evil.example/one\n"
    "[Sign in]: https://evil.example/two"
)


def waiting(
    team: Team, *, message: str = "Pick one", deadline_in: timedelta = timedelta(hours=1)
) -> InputRequest:
    call = factories.call(factories.server("deploy", name="Deploy bot", default_team=team))
    rnd = factories.open_round(call, team_=team)
    Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() + deadline_in)
    InputRequest.objects.filter(round=rnd).update(message=message)
    return InputRequest.objects.get(round=rnd)


def emailed(slug: str = "release") -> Team:
    team = factories.team(slug)
    Team.objects.filter(pk=team.pk).update(notify_emails="team@example.org")
    team.refresh_from_db()
    return team


def test_a_chat_notice_shows_a_servers_markdown_links_as_text() -> None:
    """Mattermost, Rocket.Chat, Teams and Discord take Slack's ``{"text": ...}`` and read it as Markdown:
    ``[Review in Elicit Hub](https://evil...)`` would be a phishing link dressed as the hub's own, and an
    image one every reader's client fetches."""
    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = waiting(team, message=MARKDOWN)
        notifications.notify(ir=ir, team=team, event="routed")
        (notice,) = Notification.objects.filter(team=team)
        assert notifications.notification_send(notification_id=notice.pk) is None

    text = chat.received[0].json()["text"]
    for link in ("](", "][", "]:"):  # no label ends where a link's target starts
        assert link not in text, (link, text)
    # Shown as written: only invisible word joiners were added.
    assert MARKDOWN in text.replace("\u2060", "")
    assert f"/requests/{ir.pk}/" in text


def test_brackets_that_make_no_link_are_left_alone() -> None:
    assert notifications._chat_text("[a] b [c]") == "[a] b [c]"


@pytest.mark.parametrize(
    "status", [InputRequest.Status.ANSWERED, InputRequest.Status.CANCELLED, InputRequest.Status.EXPIRED]
)
def test_a_notice_of_a_request_no_longer_waiting_is_not_sent(status: str) -> None:
    """The notice's task ran late (a backlog, a retry's backoff): the team is not sent to a request it can
    no longer answer, nor told "expires soon, still unanswered" of one that was answered."""
    team = emailed()
    ir = waiting(team)
    notifications.notify(ir=ir, team=team, event="expiring")
    (notice,) = Notification.objects.filter(team=team)
    action = (
        InputRequest.Action.ACCEPT if status == InputRequest.Status.ANSWERED else InputRequest.Action.CANCEL
    )
    InputRequest.objects.filter(pk=ir.pk).update(status=status, action=action, answered_at=timezone.now())

    assert notifications.notification_send(notification_id=notice.pk) is None  # no retry
    assert mail.outbox == []
    notice.refresh_from_db()
    assert notice.status == Notification.Status.FAILED and notice.attempts == 0
    assert notice.last_error.startswith("not sent: the request was no longer waiting"), notice.last_error


def test_a_notice_of_a_request_past_its_deadline_is_not_sent() -> None:
    """Beat has not expired it yet, but no answer is taken past the deadline."""
    team = emailed()
    ir = waiting(team, deadline_in=timedelta(seconds=-1))
    notifications.notify(ir=ir, team=team, event="escalated")
    (notice,) = Notification.objects.filter(team=team)

    assert notifications.notification_send(notification_id=notice.pk) is None
    assert mail.outbox == []
    notice.refresh_from_db()
    assert notice.status == Notification.Status.FAILED
    assert "deadline passed" in notice.last_error


def test_a_retry_stops_once_the_request_is_answered() -> None:
    """The first try failed; the request is answered before the retry: the retry sends nothing."""
    with WebhookReceiver(fail_first=1) as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = waiting(team)
        notifications.notify(ir=ir, team=team, event="routed")
        (notice,) = Notification.objects.filter(team=team)
        assert 1.0 <= (notifications.notification_send(notification_id=notice.pk) or 0) <= 2.0
        InputRequest.objects.filter(pk=ir.pk).update(
            status=InputRequest.Status.ANSWERED, action=InputRequest.Action.ACCEPT, answered_at=timezone.now()
        )
        assert notifications.notification_send(notification_id=notice.pk) is None

    assert len(chat.received) == 1
    notice.refresh_from_db()
    assert notice.status == Notification.Status.FAILED and notice.attempts == 1


@pytest.mark.django_db(transaction=True)
def test_a_second_task_for_a_notice_being_sent_does_not_send_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep's copy of a notice runs while another worker is posting it: the team gets one message."""
    # The notice's own task is kept from the suite's Celery worker (started for the session by an earlier
    # test), which would otherwise send it first: the two tries here are the test's own.
    monkeypatch.setattr(notifications, "enqueue_on_commit", lambda task, *args, **kwargs: None)
    notice_id: list[int] = []
    with MeddlingReceiver(lambda: notifications.notification_send(notification_id=notice_id[0])) as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = waiting(team)
        notifications.notify(ir=ir, team=team, event="routed")
        (notice,) = Notification.objects.filter(team=team)
        notice_id.append(notice.pk)

        assert notifications.notification_send(notification_id=notice.pk) is None

    assert chat.outcome == [None]  # the second task found the notice in hand and left it
    assert len(chat.posts) == 1
    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT and notice.attempts == 1
