"""Escalation leaves a request whose round's deadline has passed (beat may not have expired it yet): no answer
is taken then, so the fallback team is neither told "no answer yet" nor shown it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Notification, Policy, Round, Team
from approvals.services import escalation
from tests import factories

pytestmark = pytest.mark.django_db


def test_a_request_past_its_deadline_is_not_escalated() -> None:
    release, ops = factories.team("release"), factories.team("ops")
    Team.objects.filter(pk=ops.pk).update(notify_emails="ops@example.org")
    # The policy's delay is the round's clock: the request is due for escalation as its round expires.
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    server = factories.server()
    now = timezone.now()
    late = factories.open_round(factories.call(server), keys=("environment",))
    late.input_requests.update(policy=policy, team=release, created_at=now - timedelta(seconds=60))
    Round.objects.filter(pk=late.pk).update(deadline=now)
    open_ = factories.open_round(factories.call(server), keys=("region",))
    open_.input_requests.update(policy=policy, team=release, created_at=now - timedelta(seconds=60))

    assert escalation.escalate_due(now=now) == 1

    (escalated,) = InputRequest.objects.filter(escalation_team=ops)
    assert escalated.round_id == open_.pk
    left = InputRequest.objects.get(round=late)
    assert left.escalated_at is None and left.escalation_team is None
    assert not AuditEvent.objects.filter(verb="input.escalated", input_request_id=left.pk).exists()
    assert not Notification.objects.filter(input_request=left).exists()
    assert escalation.escalate_due(now=now + timedelta(seconds=15)) == 0
