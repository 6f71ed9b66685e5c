"""A policy the admin saves can run: its clocks are bounded so that a round's deadline, and every extension
added to it, stays a date (Python's end at the year 9999: ``extend_by`` 2**31-1 seconds taken a hundred
times over raised OverflowError on the extend endpoint), and a zero that would silently mean "none" (a
recent sign-in within 0 seconds asks none) is refused with a clear error."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import Policy, RoutingRule
from tests import factories

pytestmark = pytest.mark.django_db

ADD = "/admin/approvals/policy/add/"


def form(**extra: str) -> dict[str, str]:
    return {
        "name": "High risk",
        "risk": "high",
        "approvals_required": "1",
        "forbid_self_approval": "on",
        "ttl": "",
        "on_expiry": "",
        "escalate_after": "",
        "escalation_team": "",
        "reauth_within": "",
        "extend_by": "",
        "max_extensions": "1",
    } | extra


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("extend_by", "2147483647", "At most 31622400 seconds"),
        ("ttl", "2147483647", "At most 31622400 seconds"),
        ("escalate_after", "2147483647", "At most 31622400 seconds"),
        ("reauth_within", "2147483647", "At most 31622400 seconds"),
        ("max_extensions", "32767", "At most 100 extensions"),
        ("reauth_within", "0", "would ask no sign-in at all"),
        ("ttl", "0", "cannot expire at once"),
    ],
)
def test_a_policy_that_would_break_at_runtime_is_refused_with_a_clear_error(
    admin_client: Client, field: str, value: str, error: str
) -> None:
    page = admin_client.post(ADD, form(**{field: value}))
    assert page.status_code == 200, "the admin accepted it"
    assert error in page.text
    assert not Policy.objects.exists()


def test_the_longest_deadline_a_policy_allows_is_still_a_date(admin_client: Client) -> None:
    longest = form(ttl="31622400", extend_by="31622400", max_extensions="100", reauth_within="1")
    assert admin_client.post(ADD, longest).status_code == 302
    policy = Policy.objects.get()
    assert policy.ttl is not None and policy.extend_by is not None
    furthest = timezone.now() + timedelta(seconds=policy.ttl + policy.extend_by * policy.max_extensions)
    assert furthest.year < 2200


def test_an_escalation_that_could_never_happen_is_refused(admin_client: Client) -> None:
    fallback = factories.team("fallback")
    no_team = admin_client.post(ADD, form(escalate_after="600"))
    assert no_team.status_code == 200 and "needs the team to escalate to" in no_team.text
    no_delay = admin_client.post(ADD, form(escalation_team=str(fallback.pk)))
    assert no_delay.status_code == 200 and "after how many seconds" in no_delay.text
    assert not Policy.objects.exists()
    both = admin_client.post(ADD, form(escalate_after="600", escalation_team=str(fallback.pk)))
    assert both.status_code == 302


def test_a_rule_whose_policy_escalates_to_the_rules_own_team_is_refused(admin_client: Client) -> None:
    release, fallback = factories.team("release"), factories.team("fallback")
    policy = Policy.objects.create(name="Escalating", escalate_after=600, escalation_team=release)
    rule = {
        "position": "10",
        "name": "Deploys",
        "enabled": "on",
        "tool_pattern": "*",
        "destructive": "unknown",
        "read_only": "unknown",
        "open_world": "unknown",
        "conditions": "[]",
        "team": str(release.pk),
        "policy": str(policy.pk),
        "answered_by": "team",
    }
    page = admin_client.post("/admin/approvals/routingrule/add/", rule)
    assert page.status_code == 200 and "escalation would ask no one new" in page.text
    assert not RoutingRule.objects.exists()
    assert (
        admin_client.post("/admin/approvals/routingrule/add/", rule | {"team": str(fallback.pk)}).status_code
        == 302
    )
