"""A deletion in the admin audits the configuration it changes along the way, in its own transaction: a
user's team memberships and personal tokens (naming the user), the agents a user owned or that could act for
them, and the agents a deleted server or team is taken from."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.audit import core as audit
from approvals.models import AgentClient, AuditEvent
from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db


def leaving_user() -> tuple[object, AgentClient]:
    alice = factories.user("alice")
    factories.team("release", (alice, "reviewer"))
    factories.team("ops", (alice, "admin"))
    tokens.personal_token_create(user=alice, name="laptop")
    agent, _ = factories.agent("ci-bot", owner=alice)
    agent.acts_for_users.add(alice)
    return alice, agent


def test_deleting_a_user_audits_the_configuration_it_takes_along(admin_client: Client) -> None:
    alice, agent = leaving_user()
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0

    page = admin_client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"})

    assert page.status_code == 302
    assert not get_user_model().objects.filter(username="alice").exists()
    new = list(AuditEvent.objects.filter(id__gt=last))
    verbs = sorted(event.verb for event in new)
    assert verbs == ["agent.changed", "membership.removed", "membership.removed", "token.revoked"]
    assert all(event.actor_label == "admin" for event in new)
    removed = [event for event in new if event.verb != "agent.changed"]
    assert all(f"with User “alice” (#{alice.pk})" in event.data["message"] for event in removed)
    assert {event.team_slug for event in new if event.verb == "membership.removed"} == {"release", "ops"}
    changed = next(event for event in new if event.verb == "agent.changed")
    fields = {change["field"]: change for change in changed.data["changes"]}
    assert fields["owner"]["new"] is None and fields["acts_for_users"]["new"] == []
    agent.refresh_from_db()
    assert agent.owner_id is None
    assert audit.verify().ok


def test_deleting_users_in_bulk_audits_each_ones_configuration(admin_client: Client) -> None:
    alice, _ = leaving_user()
    bob = factories.user("bob")
    factories.team("release", (bob, "reviewer"))

    action = {"action": "delete_selected", "_selected_action": [str(alice.pk), str(bob.pk)], "post": "yes"}
    assert admin_client.post("/admin/auth/user/", action).status_code == 302

    removed = AuditEvent.objects.filter(verb="membership.removed")
    assert removed.count() == 3
    assert AuditEvent.objects.filter(verb="token.revoked").count() == 1
    assert not get_user_model().objects.filter(username__in=["alice", "bob"]).exists()


def test_deleting_a_server_or_a_team_audits_the_agents_it_is_taken_from(admin_client: Client) -> None:
    deploy, k8s = factories.server("deploy"), factories.server("k8s")
    ops = factories.team("ops")
    agent, _ = factories.agent("ci-bot", servers=[deploy, k8s])
    agent.acts_for_teams.add(ops)

    assert (
        admin_client.post(f"/admin/approvals/mcpserver/{deploy.pk}/delete/", {"post": "yes"}).status_code
        == 302
    )
    action = {"action": "delete_selected", "_selected_action": [str(ops.pk)], "post": "yes"}
    assert admin_client.post("/admin/approvals/team/", action).status_code == 302

    changes = [
        change
        for event in AuditEvent.objects.filter(verb="agent.changed").order_by("id")
        for change in event.data["changes"]
    ]
    assert changes == [
        {"field": "servers", "old": ["Deploy server", "K8S server"], "new": ["K8S server"]},
        {"field": "acts_for_teams", "old": ["Ops"], "new": []},
    ]
    assert audit.verify().ok
