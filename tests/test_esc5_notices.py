"""Team notices and escalation at their edges: a notice whose last try ended with its worker, and a question
a server asked on an open session once the server stopped waiting for it (its holder not having closed the
round yet). Chat notices go to a real loopback listener; email through Django's mail (the test outbox)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.db.models import F
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Notification, Policy, Round, Team, ToolCall
from approvals.services import escalation, notifications
from tests import factories
from tests.hub import WebhookReceiver
from tests.test_notifications import pending_request

pytestmark = pytest.mark.django_db


def lost_last_try(team: Team, kind: str, *, attempts: int) -> Notification:
    """A notice whose try number `attempts` ended with its worker: counted, no outcome recorded."""
    return Notification.objects.create(
        team=team,
        input_request=pending_request(team),
        kind=kind,
        event="routed",
        attempts=attempts,
        last_error="HTTP 500",
        created_at=timezone.now() - timedelta(hours=1),
    )


def test_a_chat_notice_swept_after_its_last_try_is_given_up_without_another(settings) -> None:
    settings.ELICIT_NOTIFY_MAX_ATTEMPTS = 3
    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        notice = lost_last_try(team, Notification.Kind.CHAT, attempts=3)

        assert notifications.notifications_recover(now=timezone.now()) == 1
        assert notifications.notification_send(notification_id=notice.pk) is None

    assert chat.received == []
    notice.refresh_from_db()
    assert notice.status == Notification.Status.FAILED
    assert notice.attempts == 3
    assert notice.last_error == notifications.LAST_TRY_LOST


def test_an_email_notice_swept_after_its_last_try_is_given_up_without_another(settings) -> None:
    settings.ELICIT_NOTIFY_MAX_ATTEMPTS = 2
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ops@example.org")
    team.refresh_from_db()
    notice = lost_last_try(team, Notification.Kind.EMAIL, attempts=2)

    assert notifications.notification_send(notification_id=notice.pk) is None

    assert mail.outbox == []
    notice.refresh_from_db()
    assert (notice.status, notice.attempts) == (Notification.Status.FAILED, 2)


def test_a_notice_swept_before_its_last_try_is_still_sent(settings) -> None:
    settings.ELICIT_NOTIFY_MAX_ATTEMPTS = 3
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ops@example.org")
    team.refresh_from_db()
    notice = lost_last_try(team, Notification.Kind.EMAIL, attempts=2)

    assert notifications.notification_send(notification_id=notice.pk) is None

    assert len(mail.outbox) == 1
    notice.refresh_from_db()
    assert (notice.status, notice.attempts) == (Notification.Status.SENT, 3)


def server_gave_up(team: Team, *, waited_until: timedelta, slug: str = "deploy") -> InputRequest:
    """A question a server asked on an open session, whose wait ended `waited_until` from now (negative: it
    has passed) though the hub's deadline is an hour away; still open, as until its holder notices."""
    call = factories.call(
        factories.server(slug, name="Deploy bot", default_team=team), tool="create_deployment"
    )
    rnd = factories.open_round(call, team_=team)
    now = timezone.now()
    Round.objects.filter(pk=rnd.pk).update(
        kind=Round.Kind.PUSH, deadline=now + timedelta(hours=1), server_deadline=now + waited_until
    )
    return InputRequest.objects.select_related("round__call__server").get(round=rnd)


def test_a_notice_of_a_question_its_server_stopped_waiting_for_is_not_sent() -> None:
    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = server_gave_up(team, waited_until=-timedelta(seconds=5))
        notifications.notify(ir=ir, team=team, event="routed")
        (notice,) = Notification.objects.filter(team=team)

        assert notifications.notification_send(notification_id=notice.pk) is None

    assert chat.received == []
    notice.refresh_from_db()
    assert notice.status == Notification.Status.FAILED
    assert notice.attempts == 0
    assert notice.last_error.startswith("not sent: the server stopped waiting")


def test_a_question_its_server_stopped_waiting_for_is_not_escalated() -> None:
    release, ops = factories.team("release"), factories.team("ops")
    Team.objects.filter(pk=ops.pk).update(notify_emails="ops@example.org")
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    gone = server_gave_up(release, waited_until=-timedelta(seconds=5))
    waiting = server_gave_up(release, waited_until=timedelta(minutes=5), slug="build")
    InputRequest.objects.filter(pk__in=[gone.pk, waiting.pk]).update(
        policy=policy, created_at=timezone.now() - timedelta(minutes=2)
    )

    assert escalation.escalate_due(now=timezone.now()) == 1

    gone.refresh_from_db()
    waiting.refresh_from_db()
    assert gone.escalated_at is None and gone.escalation_team_id is None
    assert waiting.escalation_team_id == ops.pk
    escalated = AuditEvent.objects.filter(verb="input.escalated")
    assert list(escalated.values_list("input_request_id", flat=True)) == [waiting.pk]
    assert list(
        Notification.objects.filter(event="escalated").values_list("input_request_id", flat=True)
    ) == [waiting.pk]


def test_no_expiry_warning_for_a_question_its_server_stopped_waiting_for(settings) -> None:
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="release@example.org")
    team.refresh_from_db()
    soon = timedelta(seconds=settings.ELICIT_EXPIRY_WARNING // 2)
    gone = server_gave_up(team, waited_until=-timedelta(seconds=5))
    waiting = server_gave_up(team, waited_until=timedelta(seconds=30), slug="build")
    Round.objects.filter(pk__in=[gone.round_id, waiting.round_id]).update(deadline=timezone.now() + soon)

    assert escalation.warn_expiring(now=timezone.now()) == 1

    assert list(Notification.objects.values_list("input_request_id", "event")) == [(waiting.pk, "expiring")]


RLO, ZWSP = "\u202e", "\u200b"


def test_a_notice_shows_a_servers_invisible_and_direction_changing_characters_as_codes() -> None:
    """The dashboard shows them as codes: in a notice a tool name holding U+202E would turn the rest of the
    subject around (the hub's own words read backwards), and a zero-width space hide in a name."""
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ops@example.org")
    team.refresh_from_db()
    ir = pending_request(team)
    ToolCall.objects.filter(pk=ir.round.call_id).update(tool=f"read_logs{RLO}")
    InputRequest.objects.filter(pk=ir.pk).update(
        message=f"Approve{ZWSP}{ZWSP} the {RLO * 40}run\rnow\nplease"
    )
    notifications.notify(ir=ir, team=team, event="routed")
    (notice,) = Notification.objects.filter(team=team)

    assert notifications.notification_send(notification_id=notice.pk) is None

    (message,) = mail.outbox
    assert message.subject == "[Elicit Hub] Deploy bot: read_logs\u27e8U+202E\u27e9 asks Release for input"
    shown = (
        "Approve\u27e8U+200B\u27e9\u27e8U+200B\u27e9 the \u27e8U+202E \u00d740\u27e9run\u27e8U+000D\u27e9now"
    )
    assert f"{shown}\nplease" in message.body
    assert RLO not in message.body and ZWSP not in message.body and "\r" not in message.body


def test_a_chat_notice_shows_a_servers_direction_changing_characters_as_codes() -> None:
    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = pending_request(team)
        ToolCall.objects.filter(pk=ir.round.call_id).update(tool=f"{RLO}yolped")
        InputRequest.objects.filter(pk=ir.pk).update(message=f"@{ZWSP}channel {RLO}")
        notifications.notify(ir=ir, team=team, event="routed")
        (notice,) = Notification.objects.filter(team=team)

        assert notifications.notification_send(notification_id=notice.pk) is None

    text = chat.received[0].json()["text"]
    assert "Deploy bot: \u27e8U+202E\u27e9yolped asks Release for input" in text
    assert "@\u2060\u27e8U+200B\u27e9channel \u27e8U+202E\u27e9" in text
    assert RLO not in text and ZWSP not in text


def test_an_expiry_warning_of_a_deadline_extended_before_it_went_out_is_not_sent(settings) -> None:
    """Its chat asked it to wait (a 429), and meanwhile a reviewer extended the round by an hour: "expires
    soon" beside a deadline an hour off would be wrong; the new deadline is warned of in its turn."""
    with WebhookReceiver(statuses=(429, 204), headers=({"Retry-After": "120"}, {})) as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        soon = timedelta(seconds=settings.ELICIT_EXPIRY_WARNING // 2)
        ir = pending_request(team, deadline_in=soon)

        assert escalation.warn_expiring(now=timezone.now()) == 1
        (warning,) = Notification.objects.filter(team=team, event="expiring")
        assert notifications.notification_send(notification_id=warning.pk) is not None  # asked to wait

        Round.objects.filter(pk=ir.round_id).update(deadline=F("deadline") + timedelta(hours=1), extensions=1)
        assert notifications.notification_send(notification_id=warning.pk) is None

        warning.refresh_from_db()
        assert warning.status == Notification.Status.FAILED
        assert (
            warning.last_error
            == "not sent: the deadline it warned of was extended before the notice went out"
        )
        assert len(chat.received) == 1

        # Near its new deadline, the round is warned of again, and that warning goes out.
        later = timezone.now() + timedelta(hours=1)
        assert escalation.warn_expiring(now=later) == 1
        (again,) = Notification.objects.filter(team=team, event="expiring.1")
        assert notifications.notification_send(notification_id=again.pk) is None
        again.refresh_from_db()
        assert again.status == Notification.Status.SENT
        assert len(chat.received) == 2
