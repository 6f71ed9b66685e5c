"""Team notices: email and a Slack-compatible chat webhook, when a request is routed, escalated or about to
expire. Email goes through Django's mail (the test outbox); chat through a real local HTTP listener."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.test import override_settings
from django.utils import timezone

from approvals.models import InputRequest, Notification, Round, Team
from approvals.services import escalation, notifications
from tests import factories
from tests.hub import WebhookReceiver
from tests.live import wait_until


def pending_request(team: Team, *, deadline_in: timedelta = timedelta(hours=1)) -> InputRequest:
    srv = factories.server(name="Deploy bot", default_team=team)
    call = factories.call(srv, tool="create_deployment", arguments={"branch": "secret-branch"})
    rnd = factories.open_round(call, team_=team)
    Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() + deadline_in)
    return InputRequest.objects.select_related("round__call__server").get(round=rnd)


def notices(team: Team, event: str) -> list[Notification]:
    return list(Notification.objects.filter(team=team, event=event).order_by("kind"))


@pytest.mark.django_db
def test_an_email_notice_reaches_every_address_of_the_team() -> None:
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ana@example.org; ben@example.org, ")
    team.refresh_from_db()
    ir = pending_request(team)

    notifications.notify(ir=ir, team=team, event="routed")
    notifications.notify(ir=ir, team=team, event="routed")  # once per kind and event
    (notice,) = notices(team, "routed")
    assert notice.kind == Notification.Kind.EMAIL

    assert notifications.notification_send(notification_id=notice.pk) is None
    (message,) = mail.outbox
    assert message.to == ["ana@example.org", "ben@example.org"]
    assert message.subject == "[Elicit Hub] Deploy bot: create_deployment asks Release for input"
    assert "Pick the environment" in message.body and f"/requests/{ir.pk}/" in message.body
    assert "secret-branch" not in message.body  # never the call's arguments
    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT and notice.attempts == 1 and notice.sent_at
    # A notice already sent is not sent again (a duplicate task finds nothing to do).
    assert notifications.notification_send(notification_id=notice.pk) is None
    assert len(mail.outbox) == 1


@pytest.mark.django_db
def test_a_chat_notice_is_posted_to_the_team_webhook() -> None:
    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = pending_request(team)

        notifications.notify(ir=ir, team=team, event="escalated")
        (notice,) = notices(team, "escalated")
        assert notice.kind == Notification.Kind.CHAT
        assert notifications.notification_send(notification_id=notice.pk) is None

    (posted,) = chat.received
    assert posted.headers["content-type"] == "application/json"
    text = posted.json()["text"]
    assert text.startswith("[Elicit Hub] Deploy bot: create_deployment escalated to Release: no answer yet")
    assert f"/requests/{ir.pk}/" in text and "secret-branch" not in text
    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT and notice.last_error == ""


@pytest.mark.django_db
@override_settings(ELICIT_NOTIFY_MAX_ATTEMPTS=3, ELICIT_WEBHOOK_RETRY_MAX=5)
def test_a_failing_chat_webhook_is_retried_with_backoff_then_given_up() -> None:
    with WebhookReceiver(fail_first=100) as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        notifications.notify(ir=pending_request(team), team=team, event="routed")
        (notice,) = notices(team, "routed")

        countdowns = [notifications.notification_send(notification_id=notice.pk) for _ in range(4)]

    # Up to 2**attempt, capped, jittered down to half of it; the third attempt is the last.
    assert 1.0 <= countdowns[0] <= 2.0 and 2.0 <= countdowns[1] <= 4.0 and countdowns[2:] == [None, None]
    assert len(chat.received) == 3
    notice.refresh_from_db()
    assert notice.status == Notification.Status.FAILED and notice.attempts == 3
    assert "500" in notice.last_error


@pytest.mark.django_db
def test_teams_are_warned_once_before_a_round_expires() -> None:
    release, fallback = factories.team("release"), factories.team("fallback")
    Team.objects.filter(pk__in=[release.pk, fallback.pk]).update(notify_emails="team@example.org")
    soon = pending_request(release, deadline_in=timedelta(minutes=5))
    InputRequest.objects.filter(pk=soon.pk).update(escalation_team=fallback)
    later_call = factories.call(factories.server("k8s"))
    factories.open_round(later_call, team_=release)  # an hour left: outside the warning window

    now = timezone.now()
    assert escalation.warn_expiring(now=now) == 1
    assert escalation.warn_expiring(now=now + timedelta(seconds=30)) == 1  # still pending, still soon
    expiring = Notification.objects.filter(event="expiring")
    assert sorted(expiring.values_list("team__slug", "input_request_id")) == [
        ("fallback", soon.pk),
        ("release", soon.pk),
    ]  # the holding team and the escalation team, once each

    InputRequest.objects.filter(pk=soon.pk).update(
        status=InputRequest.Status.ANSWERED, action=InputRequest.Action.ACCEPT, answered_at=now
    )
    assert escalation.warn_expiring(now=now) == 0  # answered requests are not warned about


@pytest.mark.django_db
def test_a_round_extended_after_its_warning_is_warned_again_before_its_new_deadline() -> None:
    release = factories.team("release")
    Team.objects.filter(pk=release.pk).update(notify_emails="team@example.org")
    soon = pending_request(release, deadline_in=timedelta(minutes=5))
    now = timezone.now()
    assert escalation.warn_expiring(now=now) == 1
    # A reviewer extends the round by an hour: the next warning is due before the new deadline.
    Round.objects.filter(pk=soon.round_id).update(deadline=now + timedelta(hours=1, minutes=5), extensions=1)
    assert escalation.warn_expiring(now=now) == 0  # the new deadline is not near yet
    later = now + timedelta(hours=1)
    assert escalation.warn_expiring(now=later) == 1
    assert escalation.warn_expiring(now=later + timedelta(seconds=30)) == 1  # still pending: no new notice
    warnings = Notification.objects.filter(input_request=soon).order_by("created_at")
    assert list(warnings.values_list("event", flat=True)) == ["expiring", "expiring.1"]
    subject, _ = notifications._text(warnings.last())  # type: ignore[arg-type]
    assert subject.endswith("expires soon, still unanswered")


@pytest.mark.django_db
def test_no_warning_past_the_deadline_or_without_a_team() -> None:
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="team@example.org")
    gone = pending_request(team, deadline_in=timedelta(seconds=-1))
    assert escalation.warn_expiring(now=timezone.now()) == 0
    InputRequest.objects.filter(pk=gone.pk).update(team=None)
    Round.objects.filter(pk=gone.round_id).update(deadline=timezone.now() + timedelta(minutes=1))
    assert escalation.warn_expiring(now=timezone.now()) == 0
    assert not Notification.objects.exists()


def test_the_worker_posts_the_notice_a_routed_request_queues(worker) -> None:
    """End to end: routing queues the notice after commit, by task name; the Celery worker posts it."""
    from approvals.services import calls

    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        srv = factories.server("deploy", name="Deploy bot", default_team=team)
        ag, _ = factories.agent(servers=[srv])
        relay, _ = calls.relay_submit(
            agent=ag,
            server_slug="deploy",
            tool="create_deployment",
            arguments={},
            input_requests={
                "env": {
                    "method": "elicitation/create",
                    "params": {
                        "mode": "form",
                        "message": "Which one?",
                        "requestedSchema": factories.ENVIRONMENT_SCHEMA,
                    },
                }
            },
        )
        wait_until(lambda: chat.received, 30, 0.1, what="the chat notice")
        notice = Notification.objects.get(input_request__round__call=relay)
        wait_until(
            lambda: Notification.objects.get(pk=notice.pk).status == Notification.Status.SENT,
            30,
            0.1,
            what="the notice marked sent",
        )
    assert "asks Release for input" in chat.received[0].json()["text"]
