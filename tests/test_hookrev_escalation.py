"""Escalation hands a request nobody answered to a fallback team that can answer it: a URL-mode request made
for one person (its assignee) is theirs alone, so it is never escalated to a team that could not open it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Membership, Notification, Policy, Team
from approvals.services import escalation
from tests import factories

pytestmark = pytest.mark.django_db


def test_a_sign_in_link_made_for_one_person_is_not_escalated_to_a_team_that_cannot_open_it() -> None:
    release, ops = factories.team("release"), factories.team("ops")
    Team.objects.filter(pk=ops.pk).update(notify_emails="ops@example.org")
    oncall = factories.user("oncall")
    Membership.objects.create(team=ops, user=oncall, role=Membership.Role.REVIEWER)
    ana = factories.user("ana")
    policy = Policy.objects.create(name="quick", escalate_after=60, escalation_team=ops)
    server = factories.server()
    now = timezone.now()
    link = factories.open_round(factories.call(server, on_behalf_of=ana), keys=("signin",))
    link.input_requests.update(
        policy=policy,
        team=release,
        mode=InputRequest.Mode.URL,
        url="https://idp.example/consent?for=ana",
        requested_schema=None,
        assignee=ana,
        created_at=now - timedelta(seconds=120),
    )
    form = factories.open_round(factories.call(server), keys=("environment",))
    form.input_requests.update(policy=policy, team=release, created_at=now - timedelta(seconds=120))

    assert escalation.escalate_due(now=now) == 1

    (escalated,) = InputRequest.objects.filter(escalation_team=ops)
    assert escalated.round_id == form.pk
    mine = InputRequest.objects.get(round=link)
    assert mine.escalated_at is None and mine.escalation_team is None
    assert not AuditEvent.objects.filter(verb="input.escalated", input_request_id=mine.pk).exists()
    assert not Notification.objects.filter(input_request=mine).exists()
    # The fallback team's reviewers could not have opened it: it is Ana's alone.
    reviewer = Client()
    reviewer.force_login(oncall)
    assert reviewer.get(f"/requests/{mine.pk}/").status_code == 404
    assert reviewer.get(f"/requests/{escalated.pk}/").status_code == 200
    assert escalation.escalate_due(now=now + timedelta(seconds=15)) == 0
