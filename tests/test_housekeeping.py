"""What beat clears so that tables do not grow with time alone (on the real PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from approvals import tasks

pytestmark = pytest.mark.django_db


def test_expired_sign_in_sessions_are_deleted_and_live_ones_kept() -> None:
    live, expired = SessionStore(), SessionStore()
    for store in (live, expired):
        store["who"] = "alice"
        store.create()
    Session.objects.filter(session_key=expired.session_key).update(expire_date=timezone.now() - timedelta(1))

    tasks.clear_expired_sessions()

    assert list(Session.objects.values_list("session_key", flat=True)) == [live.session_key]
    assert SessionStore(session_key=live.session_key).load() == {"who": "alice"}


def test_beat_clears_them_once_a_day() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["clear-expired-sessions"]
    assert entry == {"task": "approvals.tasks.clear_expired_sessions", "schedule": 86400.0}
