"""Tasks for one team notice that pile up in a backlog (workers down while the sweep queues it again) post
it once when they drain, not once each, as a webhook's do (`tests/test_whk8_backlog.py`): a task that runs
after a failed try and before that try's retry is due leaves the notice to that retry, so the chat is tried
at the pace it asked for and the notice's tries are not spent in seconds. A task whose time has come posts.

The chat is a real loopback listener; the task runs as Celery runs it (``apply``: in process, its retries at
once, so a task that posts and fails would go on posting here until its tries ran out)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from approvals import tasks
from approvals.models import Notification
from approvals.services import notifications
from tests.hub import WebhookReceiver
from tests.test_rty4_retries import chat_notice


@pytest.fixture(autouse=True)
def tries_made_here(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setattr(notifications, "enqueue_on_commit", lambda *args, **kwargs: None)
    settings.ELICIT_NOTIFY_MAX_ATTEMPTS = 5


def run_task(notice: Notification) -> None:
    result = tasks.send_notification.apply(args=[notice.pk], throw=False)
    assert result.state == "SUCCESS", result.traceback


@pytest.mark.django_db(transaction=True)
def test_notice_tasks_drained_from_a_backlog_post_a_failing_notice_once() -> None:
    with WebhookReceiver(statuses=(503,)) as chat:
        notice = chat_notice(chat.url)
        run_task(notice)
        run_task(notice)
        run_task(notice)
    assert len(chat.received) == 1
    notice.refresh_from_db()
    assert notice.status == Notification.Status.PENDING and notice.attempts == 1


@pytest.mark.django_db(transaction=True)
def test_a_notice_task_before_the_asked_wait_waits_and_one_after_it_posts() -> None:
    with WebhookReceiver(statuses=(429, 204), headers=({"retry-after": "30"}, {})) as chat:
        notice = chat_notice(chat.url)
        run_task(notice)
        assert len(chat.received) == 1
        Notification.objects.filter(pk=notice.pk).update(
            last_attempt_at=Notification.objects.get(pk=notice.pk).last_attempt_at - timedelta(seconds=10)
        )
        run_task(notice)  # 10 s after the try, the chat asked for 30: not yet
        assert len(chat.received) == 1
        Notification.objects.filter(pk=notice.pk).update(
            last_attempt_at=Notification.objects.get(pk=notice.pk).last_attempt_at - timedelta(seconds=25)
        )
        run_task(notice)  # 35 s after: its time has come
    assert len(chat.received) == 2
    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT
