"""A webhook or a team notice whose task was lost (the broker failed as it was queued after commit, or went
down holding it: `queueing.enqueue_on_commit` says the work is in PostgreSQL and beat's `recover_stuck`
queues it again) is sent all the same, once its next try is overdue; one still waiting for its retry is not
queued twice.

A lost task is a delivery row with no task behind it: created here without queueing one. The end-to-end
tests run `recover_stuck` as beat would, with the real Celery worker posting to a real loopback listener.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import tasks
from approvals.models import InputRequest, Notification, Team, ToolCall, WebhookAttempt, WebhookDelivery
from approvals.services import notifications, webhooks
from tests import factories
from tests.hub import WebhookReceiver
from tests.live import wait_until
from tests.test_notifications import pending_request


def lost_delivery(
    url: str, *, ended_ago: timedelta, attempts: int = 0, slug: str = "deploy"
) -> WebhookDelivery:
    """A delivery of a call that ended `ended_ago`, whose task never ran (or whose retry never came)."""
    ended = timezone.now() - ended_ago
    call = factories.call(
        factories.server(slug),
        callback_url=url,
        status=ToolCall.Status.COMPLETED,
        result={"content": [], "isError": False},
        finished_at=ended,
    )
    return WebhookDelivery.objects.create(
        call=call,
        event_type="call.completed",
        url=url,
        payload={"type": "call.completed", "data": {"id": str(call.pk)}},
        attempts=attempts,
        created_at=ended,
    )


def test_a_webhook_whose_task_was_lost_is_delivered_by_the_sweep(worker) -> None:
    with WebhookReceiver() as agent:
        delivery = lost_delivery(agent.url, ended_ago=timedelta(minutes=10))

        assert tasks.recover_stuck() >= 1
        posted = agent.wait_for("call.completed")
        wait_until(
            lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == WebhookDelivery.Status.DELIVERED,
            30,
            0.1,
            what="the delivery marked delivered",
        )
    assert posted.headers["webhook-id"] == str(delivery.pk)


def test_a_chat_notice_whose_task_was_lost_is_posted_by_the_sweep(worker) -> None:
    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        ir = pending_request(team)
        notice = Notification.objects.create(
            team=team,
            input_request=ir,
            kind=Notification.Kind.CHAT,
            event="routed",
            created_at=timezone.now() - timedelta(minutes=10),
        )

        assert tasks.recover_stuck() >= 1
        wait_until(lambda: chat.received, 30, 0.1, what="the chat notice")
        wait_until(
            lambda: Notification.objects.get(pk=notice.pk).status == Notification.Status.SENT,
            30,
            0.1,
            what="the notice marked sent",
        )
    assert "asks Release for input" in chat.received[0].json()["text"]


@pytest.mark.django_db
def test_the_sweep_leaves_deliveries_whose_try_is_not_overdue() -> None:
    now = timezone.now()
    fresh = lost_delivery("https://agent.example/hook", ended_ago=timedelta(seconds=30))
    assert webhooks.webhooks_recover(now=now) == 0  # its first task may still be on its way
    assert webhooks.webhooks_recover(now=now + webhooks.STALE_AFTER) == 1

    # A delivery waiting for its third try (8 s after its second) is overdue only STALE_AFTER past that.
    WebhookDelivery.objects.filter(pk=fresh.pk).update(created_at=now - timedelta(hours=1), attempts=2)
    WebhookAttempt.objects.create(delivery=fresh, number=2, at=now, error="HTTP 500")
    assert webhooks.webhooks_recover(now=now + webhooks.STALE_AFTER) == 0
    assert webhooks.webhooks_recover(now=now + webhooks.STALE_AFTER + timedelta(seconds=4)) == 1

    # Given up, delivered, or of a call that ended long ago: not swept.
    for status in (WebhookDelivery.Status.FAILED, WebhookDelivery.Status.DELIVERED):
        WebhookDelivery.objects.filter(pk=fresh.pk).update(status=status)
        assert webhooks.webhooks_recover(now=now + timedelta(hours=1)) == 0
    old = webhooks.RECOVER_WITHIN + timedelta(hours=1)
    lost_delivery("https://agent.example/other", ended_ago=old, slug="k8s")
    assert webhooks.webhooks_recover(now=now) == 0


@pytest.mark.django_db
def test_a_delivery_swept_after_its_last_try_is_given_up_without_another(settings) -> None:
    """Its last try ended with its worker (no outcome written): the sweep queues it, and it is given up."""
    settings.ELICIT_WEBHOOK_MAX_ATTEMPTS = 3
    with WebhookReceiver() as agent:
        delivery = lost_delivery(agent.url, ended_ago=timedelta(hours=1), attempts=3)
        assert webhooks.webhooks_recover(now=timezone.now()) == 1
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None
    assert agent.received == []
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED and delivery.attempts == 3


@pytest.mark.django_db
def test_the_sweep_leaves_notices_within_their_schedule_or_of_answered_requests() -> None:
    team = factories.team("release")
    ir = pending_request(team)
    notice = Notification.objects.create(
        team=team, input_request=ir, kind=Notification.Kind.EMAIL, event="routed"
    )
    now = timezone.now()
    assert notifications.notifications_recover(now=now) == 0
    assert notifications.notifications_recover(now=now + timedelta(hours=1)) == 1
    InputRequest.objects.filter(pk=ir.pk).update(
        status=InputRequest.Status.ANSWERED, action=InputRequest.Action.ACCEPT, answered_at=now
    )
    assert notifications.notifications_recover(now=now + timedelta(hours=1)) == 0
    Notification.objects.filter(pk=notice.pk).update(status=Notification.Status.SENT)
    assert notifications.notifications_recover(now=now + timedelta(hours=1)) == 0


@pytest.mark.django_db
def test_the_sweep_waits_out_the_retry_of_a_notices_latest_try_not_its_first() -> None:
    """A chat that asked to wait (a 429 with Retry-After) and then failed (a 500) is retried 4 s after that
    second try. Measured from the notice's creation, an hour old, the sweep found it overdue at once and
    queued a second task beside the retry: the team's chat got the notice twice."""
    team = factories.team("release")
    now = timezone.now()
    notice = Notification.objects.create(
        team=team,
        input_request=pending_request(team),
        kind=Notification.Kind.EMAIL,
        event="routed",
        attempts=2,
        last_error="HTTP 500",
        created_at=now - timedelta(hours=1),
        last_attempt_at=now - timedelta(seconds=10),
    )
    assert notifications.notifications_recover(now=now) == 0
    # Its retry waits at most 4 s after the second try; STALE_AFTER past that, its task was lost.
    due = notice.last_attempt_at + timedelta(seconds=4) + webhooks.STALE_AFTER
    assert notifications.notifications_recover(now=due - timedelta(seconds=1)) == 0
    assert notifications.notifications_recover(now=due) == 1
