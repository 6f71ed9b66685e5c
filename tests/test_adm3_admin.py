"""The admin as operators and attackers use it: credentials that would change where or how the hub's requests
go, and two admins editing the same object."""

from __future__ import annotations

import io
import json
import re
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from approvals.models import AuditEvent, Grant, Holder, McpServer, Membership, Policy, RoutingRule, Team
from approvals.services import config_audit, grants, servers, stdio, tokens
from tests import factories
from tests.live import free_port, start_script

pytestmark = pytest.mark.django_db

SECRET = "sk-live-4c9d2e7f1a"


def _server_form(server: McpServer, **extra: str) -> dict[str, str]:
    return {
        "slug": server.slug, "name": server.name, "transport": "http", "url": server.url, "era": "auto",
        "enabled": "on", "on_expiry": "", "call_timeout": "600", "tool_timeouts": "", **extra,
    }  # fmt: skip


RESERVED = [
    "Host: vault.internal",  # another virtual host at the address the guard let through
    "Transfer-Encoding: chunked",
    "content-length: 5",
    "Idempotency-Key: same-for-every-call",  # a server that honours it would answer the first call forever
    "Mcp-Session-Id: forged",
    "Mcp-Param-Region: eu",
]


@pytest.mark.parametrize("line", RESERVED)
def test_the_admin_refuses_a_header_the_hub_sets_itself(line: str, admin_client: Client) -> None:
    server = factories.server("deploy", headers={"Authorization": "Bearer old"})
    form = _server_form(server, new_headers=f"Authorization: Bearer {SECRET}\n{line}")
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", form)
    assert response.status_code == 200
    page = response.content.decode()
    name = line.split(":", 1)[0]
    assert f"The {name} header is set by the hub itself" in page
    assert SECRET not in page
    assert McpServer.objects.get(pk=server.pk).headers == {"Authorization": "Bearer old"}


@pytest.mark.parametrize("line", RESERVED[:2])
def test_add_server_refuses_a_header_the_hub_sets_itself(line: str) -> None:
    with pytest.raises(CommandError, match="set by the hub itself"):
        call_command(
            "add_server", "deploy", "http://127.0.0.1:9/mcp", "--header", line, "--no-probe",
            stdout=io.StringIO(), stderr=io.StringIO(),
        )  # fmt: skip
    assert not McpServer.objects.exists()


def test_ordinary_credentials_are_still_taken(admin_client: Client) -> None:
    server = factories.server("deploy")
    lines = f"Authorization: Bearer {SECRET}\nX-Api-Key: k\nCookie: s=1\nMcp-Tenant-Hint: x"
    response = admin_client.post(
        f"/admin/approvals/mcpserver/{server.pk}/change/", _server_form(server, new_headers=lines)
    )
    assert response.status_code == 302
    assert McpServer.objects.get(pk=server.pk).headers == {
        "Authorization": f"Bearer {SECRET}", "X-Api-Key": "k", "Cookie": "s=1", "Mcp-Tenant-Hint": "x",
    }  # fmt: skip


# Two admins editing the same object.


def _admin(name: str) -> Client:
    user = get_user_model().objects.create_superuser(name, f"{name}@example.com", "pw-unused-here")
    client = Client()
    client.force_login(user)
    return client


def _seen(client: Client, url: str) -> str:
    """The change page as an admin opens it: the state it was drawn from, as the form posts it back ("" if
    the page carries none)."""
    page = client.get(url).content.decode()
    found = re.search(r'name="seen_state" value="([0-9a-f]+)"', page)
    return found.group(1) if found else ""


def _rule_form(rule: RoutingRule, seen: str, **extra: str) -> dict[str, str]:
    return {
        "position": str(rule.position), "name": rule.name, "enabled": "on" if rule.enabled else "",
        "server": "", "tool_pattern": rule.tool_pattern, "mode": "", "destructive": "unknown",
        "read_only": "unknown", "open_world": "unknown", "conditions": "[]", "team": str(rule.team_id),
        "gate": "on" if rule.gate else "", "policy": "", "answered_by": "team", "seen_state": seen, **extra,
    }  # fmt: skip


def test_a_stale_rule_form_does_not_switch_back_on_a_gate_another_admin_switched_off() -> None:
    team = factories.team("release")
    rule = RoutingRule.objects.create(
        position=10, name="Prod deploys", tool_pattern="deploy_*", team=team, gate=True
    )
    url = f"/admin/approvals/routingrule/{rule.pk}/change/"
    alice, bob = _admin("alice"), _admin("bob")
    alice_seen, bob_seen = _seen(alice, url), _seen(bob, url)
    assert bob.post(url, _rule_form(rule, bob_seen, gate="")).status_code == 302
    assert RoutingRule.objects.get(pk=rule.pk).gate is False
    # Alice renames the rule on the page she opened before: it still shows the gate on.
    page = alice.post(url, _rule_form(rule, alice_seen, name="Production deploys"))
    assert page.status_code == 200
    assert "was changed by someone else since this page was opened" in page.content.decode()
    stored = RoutingRule.objects.get(pk=rule.pk)
    assert (stored.name, stored.gate) == ("Prod deploys", False)
    verbs = list(AuditEvent.objects.filter(verb__startswith="rule.").values_list("verb", "actor_label"))
    assert verbs == [("rule.gate_off", "bob")]
    # Reloaded, her form saves, and the gate stays as Bob left it unless she sets it herself.
    fresh = RoutingRule.objects.get(pk=rule.pk)
    assert alice.post(url, _rule_form(fresh, _seen(alice, url), name="Production deploys")).status_code == 302
    stored = RoutingRule.objects.get(pk=rule.pk)
    assert (stored.name, stored.gate) == ("Production deploys", False)


def test_a_stale_server_form_does_not_undo_another_admins_change() -> None:
    team = factories.team("release")
    server = factories.server("deploy", name="Deploy")
    url = f"/admin/approvals/mcpserver/{server.pk}/change/"
    alice, bob = _admin("alice"), _admin("bob")
    alice_seen, bob_seen = _seen(alice, url), _seen(bob, url)
    form = _server_form(server, default_team=str(team.pk), enabled="", seen_state=bob_seen)
    assert bob.post(url, form).status_code == 302  # Bob disables it
    page = alice.post(url, _server_form(server, name="Deploy (EU)", seen_state=alice_seen))
    assert page.status_code == 200 and "changed by someone else" in page.content.decode()
    stored = McpServer.objects.get(pk=server.pk)
    assert (stored.name, stored.enabled, stored.default_team_id) == ("Deploy", False, team.pk)


def test_a_form_saved_twice_by_the_same_admin_after_reloading_is_not_refused(admin_client: Client) -> None:
    policy = Policy.objects.create(name="Two people", approvals_required=2)
    url = f"/admin/approvals/policy/{policy.pk}/change/"
    form = {
        "name": "Two people", "risk": "low", "approvals_required": "2", "forbid_self_approval": "on",
        "ttl": "", "on_expiry": "", "escalate_after": "", "escalation_team": "", "reauth_within": "",
        "extend_by": "", "max_extensions": "0",
    }  # fmt: skip
    for required in ("3", "4"):
        posted = admin_client.post(
            url, form | {"approvals_required": required, "seen_state": _seen(admin_client, url)}
        )
        assert posted.status_code == 302
    assert Policy.objects.get(pk=policy.pk).approvals_required == 4


def test_the_seen_state_is_keyed_and_never_the_secrets_themselves(admin_client: Client) -> None:
    server = factories.server("deploy", headers={"Authorization": f"Bearer {SECRET}"})
    team = Team.objects.create(slug="ops", name="Ops", chat_webhook_url=f"https://hooks.example.com/{SECRET}")
    for url in (
        f"/admin/approvals/mcpserver/{server.pk}/change/",
        f"/admin/approvals/team/{team.pk}/change/",
    ):
        page = admin_client.get(url).content.decode()
        assert SECRET not in page
        assert re.search(r'name="seen_state" value="[0-9a-f]{40,}"', page)


# What the hub writes on a server row while an admin saves it.


def _meanwhile(monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Run `act` once while the admin's save is under way: after the request read the object's row, just
    before it writes it (as the admin reads the row's state to audit the change)."""
    stored = config_audit.stored
    pending = [act]

    def reading(obj: Any) -> Any:
        while pending:
            pending.pop()()
        return stored(obj)

    monkeypatch.setattr(config_audit, "stored", reading)


def test_saving_a_stdio_server_keeps_the_lease_a_holder_took_meanwhile(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = factories.server(
        "local", url="", transport=McpServer.Transport.STDIO, command=sys.executable, args=["-V"]
    )
    holder = Holder.objects.create(name="host:1:lease")
    _meanwhile(monkeypatch, lambda: stdio.stdio_lease_take(server_id=server.pk, holder_name=holder.name))
    form = _server_form(
        server, transport="stdio", url="", command=sys.executable, arguments="-V", name="Local"
    )
    assert admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", form).status_code == 302
    stored = McpServer.objects.get(pk=server.pk)
    assert stored.name == "Local" and stored.stdio_holder_id == holder.pk
    assert stdio.stdio_lease_held(server_id=server.pk, holder_name=holder.name)


def test_saving_a_server_keeps_a_tool_list_stored_meanwhile_when_its_probe_finds_none(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = factories.server("deploy", tools=[{"name": "old"}])
    newer = [{"name": "newer", "inputSchema": {"type": "object"}}]
    _meanwhile(monkeypatch, lambda: McpServer.objects.filter(pk=server.pk).update(tools=newer))
    posted = admin_client.post(
        f"/admin/approvals/mcpserver/{server.pk}/change/", _server_form(server, name="D")
    )
    assert posted.status_code == 302  # its probe finds nothing there (port 9): the stored list stands
    stored = McpServer.objects.get(pk=server.pk)
    assert stored.name == "D" and stored.tools == newer


def test_a_server_moved_by_the_admin_still_forgets_what_was_learned_at_the_old_address(
    admin_client: Client,
) -> None:
    server = factories.server("deploy", tools=[{"name": "old"}], probe={"ok": True, "era": "2026-07-28"})
    form = _server_form(server, url="http://127.0.0.1:9/elsewhere")
    assert admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", form).status_code == 302
    stored = McpServer.objects.get(pk=server.pk)
    assert stored.url.endswith("/elsewhere") and stored.tools is None


def test_the_admin_quotes_what_a_server_says_with_its_hidden_characters_shown(admin_client: Client) -> None:
    disguised = "\u202etsil_eteled"  # drawn right to left: it reads "delete_list"
    server = factories.server(
        "deploy",
        tools=[{"name": disguised}, {"name": "x" * 5000}],
        probe={"ok": True, "era": "2026-07-28", "server_info": {"name": "evil\u200bhub"}, "tool_count": 2},
    )
    page = admin_client.get(f"/admin/approvals/mcpserver/{server.pk}/change/").content.decode()
    assert "\u202e" not in page and "\u200b" not in page
    assert "⟨U+202E⟩tsil_eteled" in page and "evil⟨U+200B⟩hub" in page
    assert "x" * 129 not in page
    listing = admin_client.get("/admin/approvals/mcpserver/").content.decode()
    assert "\u200b" not in listing and "evil⟨U+200B⟩hub" in listing


def test_saving_an_agent_does_not_bring_back_a_token_rotated_meanwhile(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, old_token = factories.agent("ci-bot")
    rotated: list[str] = []
    _meanwhile(monkeypatch, lambda: rotated.append(tokens.agent_token_rotate(agent=agent)))
    form = {"name": "ci-bot", "owner": "", "is_active": "on"}
    assert admin_client.post(f"/admin/approvals/agentclient/{agent.pk}/change/", form).status_code == 302
    assert tokens.authenticate(old_token) is None
    assert tokens.authenticate(rotated[0]) == agent


# Deleting what a grant belongs to.


def _granted(team: Team, person: Any, approver: Any, tool: str = "create_deployment") -> Grant:
    server = McpServer.objects.filter(slug="deploy").first() or factories.server("deploy", default_team=team)
    agent = server.agents.first() or factories.agent("ci-bot", servers=[server])[0]
    call = factories.call(server, agent, tool=tool, on_behalf_of=person)
    return grants.create_from_approval(
        approver=approver,
        call=call,
        tool_digest="a" * 64,
        choice={"for": "until_revoked", "arguments": "exact"},
    )


def _revoked() -> list[dict[str, Any]]:
    return list(AuditEvent.objects.filter(verb="grant.revoked").values_list("data", flat=True))


def test_deleting_a_team_records_the_end_of_its_active_grants(admin_client: Client) -> None:
    alice, carol = factories.user("alice"), factories.user("carol")
    team = factories.team("release", (alice, Membership.Role.REVIEWER))
    grant = _granted(team, carol, alice)
    expired = _granted(team, carol, alice, tool="rollback")
    past = timezone.now() - timedelta(hours=2)
    Grant.objects.filter(pk=expired.pk).update(created_at=past, expires_at=past + timedelta(hours=1))
    posted = admin_client.post(f"/admin/approvals/team/{team.pk}/delete/", {"post": "yes"})
    assert posted.status_code == 302 and not Grant.objects.exists()
    [event] = _revoked()  # the active one; the expired one had ended already
    assert event["grant"] == str(grant.pk) and event["tool"] == "create_deployment"
    assert event["via"][0]["model"] == "approvals.Team" and "deleted with Team" in event["message"]
    assert AuditEvent.objects.filter(verb="grant.revoked", team_slug="release").count() == 1


def test_deleting_a_person_records_the_end_of_the_grants_made_for_them(admin_client: Client) -> None:
    alice, carol = factories.user("alice"), factories.user("carol")
    team = factories.team("release", (alice, Membership.Role.REVIEWER))
    grant = _granted(team, carol, alice)
    user_admin = f"/admin/{carol._meta.app_label}/{carol._meta.model_name}/{carol.pk}/delete/"
    assert admin_client.post(user_admin, {"post": "yes"}).status_code == 302
    assert not Grant.objects.filter(pk=grant.pk).exists()
    [event] = _revoked()
    assert event["grant"] == str(grant.pk) and "carol" in event["message"]


def test_a_server_stored_with_a_reserved_header_from_before_is_reached_without_it() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    script = Path(__file__).with_name("mcp_test_server.py")
    proc = start_script(
        script, [str(port)], lambda: urllib.request.urlopen(base + "/_seen", timeout=2).close(), "server"
    )
    try:
        server = factories.server(
            "deploy",
            url=base + "/mcp",
            headers={"Host": "vault.internal", "X-Api-Key": SECRET, "Idempotency-Key": "k"},
        )
        found = servers.server_probe(server)
        assert found["ok"] is True
        with urllib.request.urlopen(base + "/_seen", timeout=5) as answer:
            seen = json.load(answer)
        sent = [{name: value for name, value in request["headers"]} for request in seen]
        assert sent and all(headers["host"] == f"127.0.0.1:{port}" for headers in sent)
        assert all(headers.get("x-api-key") == SECRET for headers in sent)
        assert not any("idempotency-key" in headers for headers in sent)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
