"""Tasks for one delivery that pile up in a backlog (workers down or busy while beat's sweep queues the
delivery again every minute) post it once when they drain, not once each: a task that runs after another's
failed try, before the retry that try scheduled is due, leaves the delivery to that retry. So the receiver is
tried at the pace it asked for (its Retry-After, the backoff), and the delivery's tries are not spent in a
burst. A task whose time has come (the retry itself, the sweep's for a lost retry) still posts.

The receivers are real loopback listeners; the task runs as Celery runs it (``apply``: in process, its
retries at once, so a task that posts and fails would go on posting here until its tries ran out).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals import tasks
from approvals.models import WebhookAttempt, WebhookDelivery
from approvals.services import webhooks
from tests import test_outbound_recovery as recovery
from tests.hub import WebhookReceiver


@pytest.fixture(autouse=True)
def attempts_made_here(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """No task queued for a worker another test left running; the hub's default caps."""
    monkeypatch.setattr(webhooks, "enqueue_on_commit", lambda *args, **kwargs: None)
    settings.ELICIT_WEBHOOK_RETRY_MAX = 600
    settings.ELICIT_WEBHOOK_MAX_ATTEMPTS = 8


def lost_delivery(url: str) -> WebhookDelivery:
    """A delivery of a call that ended ten minutes ago, its first task still waiting in a backlog."""
    return recovery.lost_delivery(url, ended_ago=timedelta(minutes=10))


def run_task(delivery: WebhookDelivery) -> None:
    """The task as a worker runs it, and its retries as ``apply`` runs them: at once."""
    result = tasks.deliver_webhook.apply(args=[str(delivery.pk)], throw=False)
    assert result.state == "SUCCESS", result.traceback


@pytest.mark.django_db(transaction=True)
def test_whk8_tasks_drained_from_a_backlog_post_a_failing_delivery_once() -> None:
    with WebhookReceiver(statuses=(503,)) as agent:
        delivery = lost_delivery(agent.url)
        # The sweep found it overdue three times while its first task waited.
        assert webhooks.webhooks_recover(now=timezone.now()) == 1
        run_task(delivery)
        run_task(delivery)
        run_task(delivery)

    assert len(agent.received) == 1
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.PENDING and delivery.attempts == 1
    assert list(WebhookAttempt.objects.filter(delivery=delivery).values_list("number", "error")) == [
        (1, "HTTP 503")
    ]


@pytest.mark.django_db(transaction=True)
def test_whk8_a_task_before_the_asked_wait_leaves_the_receiver_alone_and_one_after_it_posts() -> None:
    with WebhookReceiver(statuses=(429, 204), headers=({"retry-after": "30"}, {})) as agent:
        delivery = lost_delivery(agent.url)
        countdown = webhooks.webhook_attempt(delivery_id=delivery.pk)
        assert countdown is not None and 30 <= countdown <= 33
        (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
        assert attempt.error == "HTTP 429; the receiver asked to wait 30 s"

        WebhookAttempt.objects.filter(pk=attempt.pk).update(at=timezone.now() - timedelta(seconds=20))
        run_task(delivery)  # ten seconds before the receiver's time: another task's, not the retry
        assert len(agent.received) == 1

        WebhookAttempt.objects.filter(pk=attempt.pk).update(at=timezone.now() - timedelta(seconds=31))
        run_task(delivery)  # its time has come
    assert len(agent.received) == 2
    assert agent.received[0].headers["webhook-id"] == agent.received[1].headers["webhook-id"]
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED and delivery.attempts == 2


@pytest.mark.django_db(transaction=True)
def test_whk8_the_sweeps_task_for_a_lost_retry_posts_it() -> None:
    with WebhookReceiver(statuses=(500, 204)) as agent:
        delivery = lost_delivery(agent.url)
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is not None
        # Its retry was lost with the broker; the sweep finds it overdue and queues it again.
        WebhookAttempt.objects.filter(delivery=delivery).update(at=timezone.now() - timedelta(minutes=6))
        assert webhooks.webhooks_recover(now=timezone.now()) == 1
        run_task(delivery)
    assert len(agent.received) == 2
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("attempt", "asked", "shortest"),
    [
        (1, None, 1.0),
        (3, None, 4.0),
        (12, None, 300.0),
        (1, 30.0, 30.0),
        (1, 5000.0, 540.0),
    ],
)
def test_whk8_the_shortest_countdown_is_never_longer_than_a_retry_waits(
    attempt: int, asked: float | None, shortest: float, settings: Any
) -> None:
    settings.ELICIT_WEBHOOK_RETRY_MAX = 600
    assert webhooks.shortest_countdown(attempt, retry_after=asked) == shortest
    waits = [webhooks.retry_countdown(attempt, max_attempts=99, retry_after=asked) for _ in range(300)]
    assert min(w for w in waits if w is not None) >= shortest
