"""Escalation, run by beat every 15 seconds, reads only the requests whose delay has passed: the pending
requests still within their policy's delay (a backlog of them, with a delay of a day) are left in the
database, not loaded and compared in Python on every run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.signals import post_init
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Policy, Round
from approvals.services import escalation
from tests import factories

pytestmark = pytest.mark.django_db


def _loaded(run: Any) -> tuple[Any, int]:
    """What `run()` returns, and how many input requests it built from rows."""
    built = 0

    def count(sender: Any, **kwargs: Any) -> None:
        nonlocal built
        built += 1

    post_init.connect(count, sender=InputRequest)
    try:
        return run(), built
    finally:
        post_init.disconnect(count, sender=InputRequest)


def test_escalation_reads_only_the_requests_whose_delay_has_passed() -> None:
    release, ops = factories.team("release"), factories.team("ops")
    daily = Policy.objects.create(name="daily", escalate_after=86_400, escalation_team=ops)
    quick = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    server = factories.server()
    now = timezone.now()
    waiting = factories.open_round(factories.call(server), keys=tuple(f"k{i}" for i in range(300)))
    waiting.input_requests.update(policy=daily, team=release, created_at=now - timedelta(hours=2))
    due = factories.open_round(factories.call(server), keys=("environment",))
    due.input_requests.update(policy=quick, team=release, created_at=now - timedelta(minutes=2))
    fresh = factories.open_round(factories.call(server), keys=("region",))
    fresh.input_requests.update(policy=quick, team=release, created_at=now - timedelta(seconds=30))
    # Rounds still open a day later: a round past its deadline is not escalated.
    Round.objects.filter(pk__in=[waiting.pk, due.pk, fresh.pk]).update(deadline=now + timedelta(days=2))

    escalated, built = _loaded(lambda: escalation.escalate_due(now=now))

    assert escalated == 1
    assert built == 1, built  # the one due, not the 300 waiting nor the fresh one
    (moved,) = InputRequest.objects.filter(escalation_team=ops)
    assert moved.round_id == due.pk and moved.escalated_at == now
    assert AuditEvent.objects.filter(verb="input.escalated", input_request_id=moved.pk).count() == 1
    # A day later the backlog is due too, and escalated once each.
    later, _ = _loaded(lambda: escalation.escalate_due(now=now + timedelta(days=1)))
    assert later == 301
    assert escalation.escalate_due(now=now + timedelta(days=1)) == 0
