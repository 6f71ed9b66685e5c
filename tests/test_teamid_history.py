"""The history from before slugs were fixed: a log where a team was renamed and a new team took its old slug,
and a team was deleted, is read team by team once migration 0018 has recorded which team each slug named
when (from the configuration audit), without rewriting a row of the chain."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction

from approvals.audit import core as audit
from approvals.models import AuditEvent, Membership, Team, TeamSlug
from approvals.permissions import visible_audit_events
from approvals.services import config_audit
from tests import factories

pytestmark = pytest.mark.django_db

migration = importlib.import_module("approvals.migrations.0018_team_slugs")


@contextmanager
def slugs_as_they_were() -> Iterator[None]:
    """The hub before migration 0018: slugs editable and reusable (its triggers off, inside the test's
    transaction, which is rolled back), then the claims recorded as the migration records them."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_team DISABLE TRIGGER approvals_team_slug_fixed")
        cursor.execute("ALTER TABLE approvals_team DISABLE TRIGGER approvals_team_slug_claim")
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "SET CONSTRAINTS ALL IMMEDIATE"
        )  # the deferred key checks run: ALTER needs none pending
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        cursor.execute("ALTER TABLE approvals_team ENABLE TRIGGER approvals_team_slug_fixed")
        cursor.execute("ALTER TABLE approvals_team ENABLE TRIGGER approvals_team_slug_claim")
    TeamSlug.objects.all().delete()
    migration.record_claims(apps, connection.schema_editor())


def event_of(slug: str, message: str) -> AuditEvent:
    return audit.record(
        actor=audit.Actor.system(), verb="grant.created", data={"message": message}, team_slug=slug
    )


def member(name: str, team: Team) -> Any:
    person = factories.user(name)
    Membership.objects.create(team=team, user=person, role=Membership.Role.VIEWER)
    return person


def seen(person: Any) -> set[str]:
    return {
        event.data.get("message", "")
        for event in visible_audit_events(person)
        if event.verb == "grant.created"
    }


def test_a_renamed_team_keeps_its_old_events_and_the_team_that_took_its_slug_reads_only_its_own(
    admin_user: Any,
) -> None:
    admin = audit.Actor.user(admin_user)

    def add(slug: str, name: str) -> Team:  # as the admin's add form saved a team
        team = Team.objects.create(slug=slug, name=name)
        config_audit.saved(team, None, actor=admin)
        return team

    with slugs_as_they_were():
        first = add("ops", "Ops")
        event_of("ops", "first team's secret")
        before = config_audit.stored(first)
        assert before is not None
        first.slug, first.name = "platform", "Platform"  # as the admin's change form saved a rename
        first.save()
        config_audit.saved(first, before, actor=admin)
        event_of("platform", "first team, renamed")
        second = add("ops", "New ops")
        event_of("ops", "second team's own")
        gone = add("qa", "QA")
        event_of("qa", "deleted team's")
        last = config_audit.state(gone)
        gone.delete()
        config_audit.deleted(last, actor=admin)

    alice, mallory = member("alice", first), member("mallory", second)
    assert seen(alice) == {"first team's secret", "first team, renamed"}
    assert seen(mallory) == {"second team's own"}
    assert "deleted team's" in seen(admin_user)
    # From here on slugs are fixed: the deleted team's, and the renamed team's old one, are taken for good.
    for slug in ("qa", "platform", "ops"):
        with pytest.raises(IntegrityError), transaction.atomic():
            Team.objects.create(slug=slug, name="Intruders")
    assert audit.verify().ok


def test_the_claims_from_a_history_that_does_not_explain_a_slug_never_give_an_earlier_teams_events() -> None:
    def created(event_id: int, slug: str, pk: int) -> tuple[int, str, str, dict[str, Any]]:
        return (
            event_id,
            "team.created",
            slug,
            {"object": {"model": "approvals.Team", "pk": pk}, "changes": []},
        )

    def deleted(event_id: int, slug: str, pk: int) -> tuple[int, str, str, dict[str, Any]]:
        return (
            event_id,
            "team.deleted",
            slug,
            {"object": {"model": "approvals.Team", "pk": pk}, "changes": []},
        )

    # Team 1 held "ops" and was deleted; team 2 holds "ops" now, its creation not in the history kept.
    rows = migration.slug_claims([created(5, "ops", 1), deleted(9, "ops", 1)], {2: "ops"}, ["ops", "old"])
    by_team = {(row["slug"], row["team"]): (row["from_id"], row["until_id"]) for row in rows}
    assert by_team == {("ops", None): (0, 10), ("ops", 2): (10, None), ("old", None): (0, None)}
    # A team made before the configuration was audited, never renamed: all its events.
    assert migration.slug_claims([], {3: "release"}, ["release"]) == [
        {"slug": "release", "team": 3, "from_id": 0, "until_id": None}
    ]
