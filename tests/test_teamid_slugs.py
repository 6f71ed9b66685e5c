"""Who reads a team's audit history follows the team, not a name that can pass to another team.

The audit log names the team an event concerns by its slug (covered by the chain's hashes, shown in exports).
A team's slug is therefore its identity for good: it cannot be changed once the team exists, and a slug once
used (by a team since deleted) is never given to another team, so a new team never reads an old team's
events, and a team never loses sight of its own."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.test import Client

from approvals.audit import core as audit
from approvals.models import AuditEvent, McpServer, Membership, Team, TeamSlug
from approvals.permissions import visible_audit_events
from tests import factories

pytestmark = pytest.mark.django_db

MANAGEMENT = {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}


def team_form(slug: str, name: str) -> dict[str, str]:
    return {"slug": slug, "name": name, "notify_emails": "", "chat_webhook_url": ""} | MANAGEMENT


def secret_event(team: Team) -> AuditEvent:
    """An event of `team`, as the services record one (a grant, an escalation: the team's slug)."""
    return audit.record(
        actor=audit.Actor.system(), verb="team.changed", data={"message": "ops only"}, team_slug=team.slug
    )


def member(name: str, team: Team) -> Any:
    person = factories.user(name)
    Membership.objects.create(team=team, user=person, role=Membership.Role.VIEWER)
    return person


def reads(person: Any, event: AuditEvent) -> bool:
    return visible_audit_events(person).filter(pk=event.pk).exists()


def test_a_teams_slug_cannot_be_changed_in_the_admin_so_the_team_keeps_reading_its_history(
    admin_client: Client,
) -> None:
    ops = factories.team("ops")
    alice = member("alice", ops)
    event = secret_event(ops)

    page = admin_client.post(f"/admin/approvals/team/{ops.pk}/change/", team_form("ops-renamed", "Ops"))
    assert page.status_code == 302, page.content.decode()[:2000]

    ops.refresh_from_db()
    assert ops.slug == "ops"  # the slug is shown, not offered for editing
    assert reads(alice, event)
    assert event.pk in {row.pk for row in visible_audit_events(alice)}
    form = admin_client.get(f"/admin/approvals/team/{ops.pk}/change/").content.decode()
    assert 'name="slug"' not in form and "ops" in form
    assert audit.verify().ok


def test_a_team_created_with_a_deleted_teams_slug_is_refused_and_reads_nothing_of_it(
    admin_client: Client,
) -> None:
    ops = factories.team("ops")
    event = secret_event(ops)
    page = admin_client.post(f"/admin/approvals/team/{ops.pk}/delete/", {"post": "yes"})
    assert page.status_code == 302, page.content.decode()[:2000]
    assert not Team.objects.filter(slug="ops").exists()

    page = admin_client.post("/admin/approvals/team/add/", team_form("ops", "New ops"))
    assert page.status_code == 200  # the form again, with the reason
    assert "was used by a team before" in page.content.decode()
    assert not Team.objects.filter(slug="ops").exists()

    # Whatever path makes a team (a command's get_or_create, a fixture), the database refuses the slug.
    with pytest.raises(IntegrityError), transaction.atomic():
        Team.objects.create(slug="ops", name="New ops")

    # Even with a new team under another slug, its member reads nothing of the old team's.
    mallory = member("mallory", factories.team("ops-two"))
    assert not reads(mallory, event)


def test_a_renamed_teams_old_slug_cannot_be_taken_by_a_new_team(admin_client: Client) -> None:
    ops = factories.team("ops")
    alice = member("alice", ops)
    event = secret_event(ops)
    admin_client.post(f"/admin/approvals/team/{ops.pk}/change/", team_form("platform", "Platform"))

    page = admin_client.post("/admin/approvals/team/add/", team_form("ops", "Intruders"))
    newcomer = Team.objects.filter(slug="ops").exclude(pk=ops.pk).first()
    if newcomer is not None:  # only where a rename and a reuse both went through
        mallory = member("mallory", newcomer)
        assert not reads(mallory, event), "a new team with an old slug reads the old team's events"
    assert page.status_code == 200 and newcomer is None
    assert reads(alice, event)


def test_the_orm_cannot_change_a_teams_slug_behind_the_admins_back() -> None:
    ops = factories.team("ops")
    with pytest.raises(IntegrityError), transaction.atomic():
        Team.objects.filter(pk=ops.pk).update(slug="platform")
    ops.slug = "platform"
    with pytest.raises(IntegrityError), transaction.atomic():
        ops.save()
    # Everything else about a team stays editable, the name included.
    Team.objects.filter(pk=ops.pk).update(name="Platform", notify_emails="ops@example.org")
    assert Team.objects.get(pk=ops.pk).name == "Platform"


def test_a_deleted_teams_slug_stays_retired_and_its_events_stay_for_superusers_only(
    admin_user: Any,
) -> None:
    ops = factories.team("ops")
    alice = member("alice", ops)
    event = secret_event(ops)
    ops.delete()
    [claim] = TeamSlug.objects.filter(slug="ops")
    assert claim.team_id is None and claim.until_id is None
    assert not reads(alice, event)
    assert reads(admin_user, event)
    with pytest.raises(IntegrityError), transaction.atomic():
        factories.team("ops")


def test_add_server_names_a_retired_team_slug_instead_of_failing() -> None:
    from django.core.management import CommandError, call_command

    Team.objects.create(slug="gone", name="Gone").delete()
    with pytest.raises(CommandError, match="a slug names one team for good"):
        call_command("add_server", "deploy", "http://127.0.0.1:9/mcp", "--team", "gone", "--no-probe")
    assert not McpServer.objects.filter(slug="deploy").exists()
