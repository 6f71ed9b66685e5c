"""Escalation and deadline notices in the odd cases: a policy whose fallback is the request's own team, a
team deleted while its requests wait, a request answered just before escalation comes (on the real
PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Membership, Notification, Policy, Round, Team
from approvals.services import answers, escalation
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting(team: Team, policy: Policy, *, age: timedelta, deadline: timedelta) -> InputRequest:
    now = timezone.now()
    rnd = factories.open_round(factories.call(factories.server()), keys=("environment",))
    rnd.input_requests.update(policy=policy, team=team, created_at=now - age)
    Round.objects.filter(pk=rnd.pk).update(deadline=now + deadline)
    return rnd.input_requests.get()


def test_a_policy_whose_fallback_is_the_requests_own_team_does_not_escalate_it() -> None:
    release = factories.team("release")
    Team.objects.filter(pk=release.pk).update(notify_emails="release@example.com")
    release.refresh_from_db()
    # The rule was made with another fallback; the policy was changed to escalate to release afterwards.
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=release)
    ir = _waiting(release, policy, age=timedelta(minutes=5), deadline=timedelta(hours=1))

    assert escalation.escalate_due(now=timezone.now()) == 0

    ir.refresh_from_db()
    assert ir.escalated_at is None and ir.escalation_team is None
    assert not AuditEvent.objects.filter(verb="input.escalated").exists()
    assert not Notification.objects.filter(event="escalated").exists()


def test_the_fallback_team_hears_of_the_deadline_when_the_requests_own_team_was_deleted() -> None:
    release, ops = factories.team("release"), factories.team("ops")
    Team.objects.filter(pk=ops.pk).update(notify_emails="ops@example.com")
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    soon = timedelta(seconds=settings.ELICIT_EXPIRY_WARNING // 2)
    ir = _waiting(release, policy, age=timedelta(minutes=5), deadline=soon)
    InputRequest.objects.filter(pk=ir.pk).update(escalated_at=timezone.now(), escalation_team=ops)
    release.delete()  # while the request waits
    ir.refresh_from_db()
    assert ir.team_id is None and ir.escalation_team_id == ops.pk

    assert escalation.warn_expiring(now=timezone.now()) == 1

    notice = Notification.objects.get(input_request=ir)
    assert notice.team_id == ops.pk
    assert notice.event.startswith("expiring")


def test_a_request_answered_before_its_escalation_runs_is_not_escalated() -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    ops = factories.team("ops")
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    ir = _waiting(release, policy, age=timedelta(minutes=5), deadline=timedelta(hours=1))
    answers.input_respond(
        input_request_id=ir.pk, user=alice, action="accept", content={"environment": "staging"}
    )

    assert escalation.escalate_due(now=timezone.now()) == 0
    ir.refresh_from_db()
    assert ir.escalated_at is None
    assert ir.status == InputRequest.Status.ANSWERED


def test_a_request_of_no_team_is_still_escalated_to_its_policys_fallback() -> None:
    ops = factories.team("ops")
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    rnd = factories.open_round(factories.call(factories.server()), keys=("environment",))
    rnd.input_requests.update(policy=policy, team=None, created_at=timezone.now() - timedelta(minutes=5))

    assert escalation.escalate_due(now=timezone.now()) == 1
    assert rnd.input_requests.get().escalation_team_id == ops.pk
