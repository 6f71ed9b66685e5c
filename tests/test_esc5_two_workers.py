"""Two beat runs at once (a slow run overlapping the next, or two beats by mistake), each on its own
PostgreSQL connection: a request is escalated once, with one audit record and one notice per kind, however
the runs interleave. The second run reads the request before the first commits and then waits on its row."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Notification, Policy, Round, Team
from approvals.services import escalation, notifications
from tests import factories
from tests.live import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _blocked_on_a_row() -> bool:
    """Whether another session of this database waits for a lock (the second run, on the request's row)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid()"
        )
        (waiting,) = cursor.fetchone()
    return bool(waiting)


def test_two_runs_at_once_escalate_a_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = factories.team("ops")
    Team.objects.filter(pk=ops.pk).update(
        notify_emails="ops@example.org", chat_webhook_url="https://chat.example/h"
    )
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    rnd = factories.open_round(factories.call(factories.server()), team_=factories.team("release"))
    now = timezone.now()
    rnd.input_requests.update(policy=policy, created_at=now - timedelta(minutes=5))
    Round.objects.filter(pk=rnd.pk).update(deadline=now + timedelta(hours=1))
    ir = rnd.input_requests.get()
    monkeypatch.setattr(notifications, "enqueue_on_commit", lambda *args, **kwargs: None)  # no worker here

    notify = notifications.notify
    second: dict[str, Any] = {}

    def run_second() -> None:
        try:
            second["escalated"] = escalation.escalate_due(now=now)
        except Exception as exc:  # reported to the test's thread below
            second["error"] = exc
        finally:
            connection.close()

    def notify_then_let_the_second_run_wait(**kwargs: Any) -> None:
        """In the first run, with the request's row updated and not yet committed: start the second run
        and go on only once it waits on that row."""
        if threading.current_thread() is threading.main_thread() and "thread" not in second:
            second["thread"] = threading.Thread(target=run_second)
            second["thread"].start()
            wait_until(_blocked_on_a_row, 30, 0.02, what="the second run waiting on the request's row")
        notify(**kwargs)

    monkeypatch.setattr(notifications, "notify", notify_then_let_the_second_run_wait)
    first = escalation.escalate_due(now=now)
    second["thread"].join(30)

    assert "error" not in second, second.get("error")
    assert (first, second["escalated"]) == (1, 0)
    ir.refresh_from_db()
    assert ir.escalation_team_id == ops.pk and ir.status == InputRequest.Status.PENDING
    assert AuditEvent.objects.filter(verb="input.escalated", input_request_id=ir.pk).count() == 1
    assert sorted(Notification.objects.filter(event="escalated").values_list("kind", flat=True)) == [
        Notification.Kind.CHAT,
        Notification.Kind.EMAIL,
    ]


def test_two_runs_at_once_warn_a_team_once(settings, monkeypatch: pytest.MonkeyPatch) -> None:
    release = factories.team("release")
    Team.objects.filter(pk=release.pk).update(notify_emails="release@example.org")
    rnd = factories.open_round(factories.call(factories.server()), team_=release)
    now = timezone.now()
    Round.objects.filter(pk=rnd.pk).update(
        deadline=now + timedelta(seconds=settings.ELICIT_EXPIRY_WARNING // 2)
    )
    monkeypatch.setattr(notifications, "enqueue_on_commit", lambda *args, **kwargs: None)

    get_or_create = Notification.objects.get_or_create
    second: dict[str, Any] = {}

    def run_second() -> None:
        try:
            second["warned"] = escalation.warn_expiring(now=now)
        except Exception as exc:
            second["error"] = exc
        finally:
            connection.close()

    def created_then_let_the_second_run_wait(**kwargs: Any) -> Any:
        found = get_or_create(**kwargs)
        if threading.current_thread() is threading.main_thread() and "thread" not in second:
            second["thread"] = threading.Thread(target=run_second)
            second["thread"].start()
            wait_until(_blocked_on_a_row, 30, 0.02, what="the second run waiting on the new notice")
        return found

    monkeypatch.setattr(Notification.objects, "get_or_create", created_then_let_the_second_run_wait)
    assert escalation.warn_expiring(now=now) == 1
    second["thread"].join(30)

    assert "error" not in second, second.get("error")
    assert second["warned"] == 1
    assert Notification.objects.filter(event="expiring").count() == 1
