"""A team or a policy a pending input request still points to cannot be deleted in the admin: the request
would lose its reviewers (a request of no team is any staff member's), its fallback team, or its policy's
recent sign-in. The page says which requests hold it; once they are closed it may go, audited as before."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Policy, Team
from tests import factories

pytestmark = pytest.mark.django_db


def pending_request(team: Team, **links: Any) -> InputRequest:
    call = factories.call(factories.server(default_team=team))
    factories.open_round(call, team_=team)
    ir = InputRequest.objects.get(round__call=call)
    InputRequest.objects.filter(pk=ir.pk).update(**links)
    return ir


def close(ir: InputRequest) -> None:
    InputRequest.objects.filter(pk=ir.pk).update(
        status=InputRequest.Status.CANCELLED, action=InputRequest.Action.CANCEL, answered_at=timezone.now()
    )


def test_a_policy_a_pending_request_needs_is_not_deleted(admin_client: Client) -> None:
    policy = Policy.objects.create(name="High risk", reauth_within=300, approvals_required=2)
    ir = pending_request(factories.team("release"), policy=policy)
    url = f"/admin/approvals/policy/{policy.pk}/delete/"

    page = admin_client.get(url)
    assert page.status_code == 200 and "Cannot delete" in page.text
    assert f"Pending input request “environment” of call {ir.round.call_id}" in page.text
    admin_client.post(url, {"post": "yes"})
    ir.refresh_from_db()
    assert ir.policy_id == policy.pk  # the recent sign-in it asks for still applies
    assert not AuditEvent.objects.filter(verb="policy.deleted").exists()

    # The bulk action refuses too.
    action = {"action": "delete_selected", "_selected_action": [str(policy.pk)], "post": "yes"}
    admin_client.post("/admin/approvals/policy/", action)
    assert Policy.objects.filter(pk=policy.pk).exists()

    close(ir)
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Policy.objects.filter(pk=policy.pk).exists()
    assert AuditEvent.objects.filter(verb="policy.deleted").count() == 1


@pytest.mark.parametrize("link", ["team", "escalation_team"])
def test_a_team_a_pending_request_is_routed_or_escalated_to_is_not_deleted(
    admin_client: Client, link
) -> None:
    release, fallback = factories.team("release"), factories.team("fallback")
    target = release if link == "team" else fallback
    ir = pending_request(release, escalation_team=fallback)
    url = f"/admin/approvals/team/{target.pk}/delete/"

    page = admin_client.post(url, {"post": "yes"})
    assert page.status_code == 200 and "Cannot delete" in page.text
    ir.refresh_from_db()
    assert (ir.team_id, ir.escalation_team_id) == (release.pk, fallback.pk)
    assert Team.objects.filter(pk=target.pk).exists()
    assert not AuditEvent.objects.filter(verb="team.deleted").exists()

    close(ir)
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Team.objects.filter(pk=target.pk).exists()
