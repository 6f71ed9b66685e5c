"""Configuration changes are audited: what the admin saves or deletes (inlines and the rows a deletion takes
along included), and the tokens, agents and servers the commands create, rotate or change, each one event
in the change's transaction, naming who and what changed (old -> new); a secret only as set, changed or
cleared, never its value; and the chain still verifies."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.management.commands import bootstrap_demo
from approvals.models import AgentClient, AuditEvent, Membership, Policy, RoutingRule
from tests import factories

pytestmark = pytest.mark.django_db

SECRET = "Bearer sk-live-9f8e7d6c5b4a3f2e1d0c"


def events(verb: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(verb=verb).order_by("id"))


def in_audit_log(text: str) -> int:
    """Events holding `text` in any column: data, labels, the search vector."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM approvals_auditevent e WHERE row_to_json(e)::text ILIKE %s", [f"%{text}%"]
        )
        return int(cursor.fetchone()[0])


def assert_chain_verifies() -> None:
    report = audit.verify()
    assert report.ok, report.problem
    assert report.checked == AuditEvent.objects.count() > 0


def policy_form(**extra: str) -> dict[str, str]:
    return {
        "name": "Production",
        "risk": "high",
        "approvals_required": "2",
        "forbid_self_approval": "on",
        "ttl": "",
        "on_expiry": "",
        "escalate_after": "",
        "escalation_team": "",
        "reauth_within": "",
        "extend_by": "",
        "max_extensions": "1",
    } | extra


def test_lowering_a_policys_approvals_in_the_admin_records_who_and_old_to_new(
    admin_client: Client, admin_user: Any
) -> None:
    policy = Policy.objects.create(name="Production", risk="high", approvals_required=2)
    page = admin_client.post(
        f"/admin/approvals/policy/{policy.pk}/change/", policy_form(approvals_required="1")
    )
    assert page.status_code == 302, page.content.decode()[:2000]

    [event] = events("policy.changed")
    assert (event.actor_type, event.actor_id, event.actor_label) == ("user", str(admin_user.pk), "admin")
    assert event.data["object"] == {"model": "approvals.Policy", "pk": policy.pk, "name": "Production"}
    assert event.data["changes"] == [
        {"field": "revision", "old": 1, "new": 2},
        {"field": "approvals_required", "old": 2, "new": 1},
    ]
    assert "approvals_required 2 -> 1" in event.data["message"]
    listing = admin_client.get(reverse("audit:index"), {"verb": "policy.*"}).content.decode()
    assert "approvals_required 2 -&gt; 1" in listing  # the audit page's summary column

    # A save that changes nothing but the revision (which voids approvals) is recorded too; a new policy is.
    assert admin_client.post("/admin/approvals/policy/add/", policy_form(name="Staging")).status_code == 302
    [created] = events("policy.created")
    assert {"field": "approvals_required", "old": None, "new": 2} in created.data["changes"]
    assert_chain_verifies()


def test_a_membership_added_changed_and_removed_through_the_teams_inline_is_recorded(
    admin_client: Client,
) -> None:
    team = factories.team("release")
    alice = factories.user("alice")
    url = f"/admin/approvals/team/{team.pk}/change/"
    base = {"slug": "release", "name": "Release", "notify_emails": "", "chat_webhook_url": ""}

    def inline(initial: int, **row: str) -> dict[str, str]:
        fields = {"team": str(team.pk), "user": str(alice.pk), "role": "reviewer", "id": ""} | row
        management = {"TOTAL_FORMS": "1", "INITIAL_FORMS": str(initial), "MIN_NUM_FORMS": "0"}
        return (
            base
            | {f"memberships-{k}": v for k, v in management.items()}
            | {f"memberships-0-{k}": v for k, v in fields.items()}
        )

    assert admin_client.post(url, inline(0)).status_code == 302
    member = Membership.objects.get(team=team, user=alice)
    [added] = events("membership.added")
    assert added.team_slug == "release" and added.actor_label == "admin"
    assert added.data["object"]["model"] == "approvals.Membership"
    assert {"field": "user", "old": None, "new": f"alice (#{alice.pk})"} in added.data["changes"]
    assert {"field": "role", "old": None, "new": "reviewer"} in added.data["changes"]
    assert not events("team.changed")  # the team's own fields did not change

    assert admin_client.post(url, inline(1, id=str(member.pk), role="admin")).status_code == 302
    [changed] = events("membership.changed")
    assert changed.data["changes"] == [{"field": "role", "old": "reviewer", "new": "admin"}]

    assert admin_client.post(url, inline(1, id=str(member.pk), role="admin", DELETE="on")).status_code == 302
    assert not Membership.objects.exists()
    [removed] = events("membership.removed")
    assert removed.data["object"] == {
        "model": "approvals.Membership",
        "pk": member.pk,
        "name": "alice in Release (admin)",
    }
    assert_chain_verifies()


def test_a_teams_chat_webhook_set_in_the_admin_is_recorded_as_set_never_by_value(
    admin_client: Client,
) -> None:
    team = factories.team("release")
    hook = "http://127.0.0.1:9/services/T0000/B0000/9f8e7d6c5b4a3f2e1d0c"
    form = {"slug": "release", "name": "Release managers", "notify_emails": "", "chat_webhook_url": hook}
    management = {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}
    page = admin_client.post(f"/admin/approvals/team/{team.pk}/change/", form | management)
    assert page.status_code == 302, page.content.decode()[:2000]
    [event] = events("team.changed")
    assert event.data["changes"] == [
        {"field": "name", "old": "Release", "new": "Release managers"},
        {"field": "chat_webhook_url", "change": "set"},
    ]
    assert event.team_slug == "release"
    assert in_audit_log("9f8e7d6c5b4a3f2e1d0c") == 0 and in_audit_log("/services/T0000") == 0
    assert_chain_verifies()


def server_form(**extra: str) -> dict[str, str]:
    return {
        "slug": "deploy",
        "name": "Deploy server",
        "transport": "http",
        "url": "http://127.0.0.1:9/mcp",
        "enabled": "on",
        "on_expiry": "",
    } | extra


def test_a_servers_credentials_set_in_the_admin_are_recorded_as_set_changed_cleared_never_by_value(
    admin_client: Client,
) -> None:
    server = factories.server("deploy")
    url = f"/admin/approvals/mcpserver/{server.pk}/change/"
    steps = [
        (server_form(new_headers=f"Authorization: {SECRET}"), "set"),
        (server_form(new_headers=f"Authorization: {SECRET}-2"), "changed"),
        (server_form(clear_headers="on", enabled=""), "cleared"),
    ]
    for form, change in steps:
        assert admin_client.post(url, form).status_code == 302
        event = events("server.changed")[-1]
        assert {"field": "headers", "change": change} in event.data["changes"]
    assert len(events("server.changed")) == 3
    assert {"field": "enabled", "old": True, "new": False} in events("server.changed")[-1].data["changes"]
    assert "headers cleared" in events("server.changed")[-1].data["message"]
    # The probe that follows a save is recorded after the change it follows.
    assert events("server.probed")[0].id > events("server.changed")[0].id

    assert in_audit_log(SECRET) == 0 and in_audit_log("9f8e7d6c5b4a3f2e1d0c") == 0
    assert_chain_verifies()


def test_turning_a_gate_rule_off_in_the_changelist_has_its_own_verb(admin_client: Client) -> None:
    rule = RoutingRule.objects.create(name="Production deploys", team=factories.team("release"), gate=True)
    page = admin_client.post(
        "/admin/approvals/routingrule/",
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-0-id": str(rule.pk),
            "form-0-position": "100",  # "enabled" left out: unticked
            "_save": "Save",
        },
    )
    assert page.status_code == 302, page.content.decode()[:2000]
    [event] = events("rule.gate_off")
    assert {"field": "enabled", "old": True, "new": False} in event.data["changes"]
    assert event.team_slug == "release" and event.actor_label == "admin"
    assert "switched its gate off" in event.data["message"]
    assert_chain_verifies()


def test_deleting_a_team_records_the_rules_and_members_it_takes_and_the_policies_it_changes(
    admin_client: Client,
) -> None:
    team = factories.team("release", (factories.user("alice"), "reviewer"))
    policy = Policy.objects.create(name="Production", escalation_team=team)
    rule = RoutingRule.objects.create(name="Production deploys", team=team, policy=policy, gate=True)
    page = admin_client.post(f"/admin/approvals/team/{team.pk}/delete/", {"post": "yes"})
    assert page.status_code == 302, page.content.decode()[:2000]

    verbs = list(AuditEvent.objects.order_by("id").values_list("verb", flat=True))
    assert verbs[0] == "team.deleted"
    assert sorted(verbs[1:]) == ["membership.removed", "policy.changed", "rule.deleted"]
    [gone] = events("rule.deleted")
    assert gone.data["object"]["pk"] == rule.pk and gone.data["via"][0]["model"] == "approvals.Team"
    [changed] = events("policy.changed")
    assert changed.data["changes"] == [
        {"field": "escalation_team", "old": f"Release (#{team.pk})", "new": None}
    ]
    assert_chain_verifies()


def test_an_agents_servers_changed_in_the_admin_are_recorded_old_to_new(admin_client: Client) -> None:
    deploy, k8s = factories.server("deploy"), factories.server("k8s")
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    form = {"name": "ci-bot", "servers": [str(deploy.pk), str(k8s.pk)], "owner": "", "is_active": "on"}
    assert admin_client.post(f"/admin/approvals/agentclient/{agent.pk}/change/", form).status_code == 302
    [event] = events("agent.changed")
    assert event.data["changes"] == [
        {"field": "servers", "old": ["Deploy server"], "new": ["Deploy server", "K8S server"]}
    ]
    assert_chain_verifies()


def run(*args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def test_tokens_created_by_the_commands_are_recorded_without_the_token(admin_client: Client) -> None:
    factories.user("alice")
    factories.server("deploy")
    personal = re.search(r"token: (\S+)", run("create_token", "alice", "--name", "laptop"))
    output = run("create_agent", "ci-bot", "--server", "deploy", "--webhook-secret")
    agent_token = re.search(r"^token: (\S+)", output, re.MULTILINE)
    webhook_secret = re.search(r"webhook secret: (\S+)", output)
    assert personal and agent_token and webhook_secret

    [token] = events("token.created")
    assert (token.actor_type, token.actor_label) == ("system", "manage.py create_token")
    assert token.data["object"]["model"] == "approvals.PersonalToken"
    assert {"field": "token_hash", "change": "set"} in token.data["changes"]
    assert {"field": "name", "old": None, "new": "laptop"} in token.data["changes"]
    [agent] = events("agent.created")
    assert agent.actor_label == "manage.py create_agent"
    assert {"field": "servers", "old": None, "new": ["Deploy server"]} in agent.data["changes"]
    assert {"field": "webhook_secret", "change": "set"} in agent.data["changes"]
    # Revoked in the admin: deleted, by the admin.
    delete = f"/admin/approvals/personaltoken/{token.data['object']['pk']}/delete/"
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    [revoked] = events("token.revoked")
    assert revoked.actor_label == "admin" and revoked.data["object"] == token.data["object"]
    for secret in (personal[1], agent_token[1], webhook_secret[1]):
        assert in_audit_log(secret) == 0
    assert_chain_verifies()


def test_bootstrap_demo_records_what_it_sets_up_and_the_token_it_rotates_without_it(
    monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path
) -> None:
    settings.ELICIT_DEMO_MCP_URL = "http://127.0.0.1:9/mcp"  # refused at once: the probe fails, registered
    kept = tmp_path / "demo-agent.token"
    monkeypatch.setattr(bootstrap_demo, "token_file", lambda: kept)
    run("bootstrap_demo")
    first = kept.read_text()
    setup = list(AuditEvent.objects.exclude(verb="server.probed").values_list("verb", "actor_label"))
    assert setup == [
        ("team.created", "manage.py bootstrap_demo"),
        ("membership.added", "manage.py bootstrap_demo"),
        ("server.created", "manage.py add_server"),
        ("server.changed", "manage.py bootstrap_demo"),
        ("agent.created", "manage.py bootstrap_demo"),
    ]

    kept.write_text("a token of another database")
    run("bootstrap_demo")  # nothing else changes, so only the rotation is recorded
    second = kept.read_text()
    assert second != first
    assert AuditEvent.objects.exclude(verb="server.probed").count() == len(setup) + 1
    [rotated] = events("token.rotated")
    assert rotated.data["object"] == {
        "model": "approvals.AgentClient",
        "pk": AgentClient.objects.get(name="demo-agent").pk,
        "name": "demo-agent",
    }
    assert {"field": "token_hash", "change": "changed"} in rotated.data["changes"]
    assert in_audit_log(first) == 0 and in_audit_log(second) == 0
    assert_chain_verifies()
