"""The expiry warning runs every 15 s over every request whose round expires within the warning window: a run
after the teams were told reads that window once, not a notice per request (a backlog of hundreds expiring
within ten minutes cost hundreds of statements every run, forty runs in a row)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import InputRequest, Notification, Round, Team
from approvals.services import escalation, notifications
from tests import factories

pytestmark = pytest.mark.django_db


def _expiring(count: int, team: Team, fallback: Team | None = None) -> list[InputRequest]:
    server = factories.server(default_team=team)
    made = []
    for n in range(count):
        rnd = factories.open_round(factories.call(server, tool=f"tool_{n}"), team_=team)
        Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() + timedelta(minutes=5))
        made.append(rnd.input_requests.get())
    if fallback is not None:
        InputRequest.objects.filter(pk__in=[ir.pk for ir in made]).update(escalation_team=fallback)
    return made


@pytest.fixture(autouse=True)
def _nothing_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notifications, "enqueue_on_commit", lambda *args, **kwargs: None)


@pytest.mark.parametrize("count", [2, 12])
def test_a_run_after_the_teams_were_warned_reads_the_window_once(count: int) -> None:
    release, fallback = factories.team("release"), factories.team("fallback")
    Team.objects.filter(pk=release.pk).update(
        notify_emails="release@example.org", chat_webhook_url="https://chat.example.org/hook"
    )
    Team.objects.filter(pk=fallback.pk).update(notify_emails="fallback@example.org")
    _expiring(count, release, fallback)
    now = timezone.now()
    assert escalation.warn_expiring(now=now) == count
    assert Notification.objects.filter(event="expiring").count() == 3 * count

    with CaptureQueriesContext(connection) as queries:
        assert escalation.warn_expiring(now=now + timedelta(seconds=15)) == count  # still pending, still soon
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert Notification.objects.filter(event="expiring").count() == 3 * count  # nobody told twice


def test_a_kind_of_notice_added_since_the_warning_is_still_sent_and_an_extension_warns_again() -> None:
    release = factories.team("release")
    Team.objects.filter(pk=release.pk).update(notify_emails="release@example.org")
    (ir,) = _expiring(1, release)
    now = timezone.now()
    assert escalation.warn_expiring(now=now) == 1
    Team.objects.filter(pk=release.pk).update(chat_webhook_url="https://chat.example.org/hook")
    assert escalation.warn_expiring(now=now + timedelta(seconds=15)) == 1
    kinds = Notification.objects.filter(input_request=ir, event="expiring").values_list("kind", flat=True)
    assert sorted(kinds) == ["chat", "email"]

    Round.objects.filter(pk=ir.round_id).update(deadline=now + timedelta(minutes=5), extensions=12)
    assert escalation.warn_expiring(now=now + timedelta(seconds=30)) == 1
    events = Notification.objects.filter(input_request=ir).values_list("event", "kind")
    assert sorted(events) == [
        ("expiring", "chat"),
        ("expiring", "email"),
        ("expiring.12", "chat"),
        ("expiring.12", "email"),
    ]


def test_a_team_without_notices_costs_no_statement_per_request() -> None:
    quiet = factories.team("quiet")
    _expiring(5, quiet)
    with CaptureQueriesContext(connection) as queries:
        assert escalation.warn_expiring(now=timezone.now()) == 5
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert not Notification.objects.exists()
