"""The queue's grant suggestion reads a team's gate decisions by the slugs it holds (``TeamSlug``), as the
audit pages do: a slug it held before counts as its own, and a slug another team held first never shows that
team's decisions."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.audit import core as audit
from approvals.models import AuditEvent, Membership, TeamSlug
from approvals.services import grants
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(settings) -> Any:
    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 3
    alice, olga = factories.user("alice"), factories.user("olga")
    root = factories.user("root", is_superuser=True, is_staff=True)
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    return SimpleNamespace(alice=alice, olga=olga, root=root, release=release)


def decisions(verb: str, count: int, *, team: str, server: str = "deploy", tool: str = "wipe") -> int:
    """`count` gate decisions of `team` (as the events name it); the id of the last."""
    audit.append_many(
        [
            {
                "at": timezone.now() - timedelta(hours=1),
                "actor_type": "user",
                "actor_id": "1",
                "actor_label": "someone",
                "verb": verb,
                "server_slug": server,
                "team_slug": team,
                "tool": tool,
                "data": {},
            }
        ]
        * count
    )
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def team_after_an_earlier_one(slug: str, earlier_until: int, *members: Any) -> Any:
    """A team holding `slug` from event `earlier_until` on, where a team since deleted held it before (the
    history from before slugs were fixed, as migration 0018 records it)."""
    team = factories.team(slug, *members)
    TeamSlug.objects.filter(slug=slug, team=team).update(from_id=earlier_until)
    TeamSlug.objects.create(slug=slug, team=None, from_id=0, until_id=earlier_until)
    return team


def shown(user: Any) -> list[tuple[str, str, str, int]]:
    return [(s.team, s.server, s.tool, s.approvals) for s in grants.suggestions(user)]


def test_a_slug_an_earlier_team_held_does_not_suggest_that_teams_tools(world) -> None:
    last = decisions("gate.approved", 5, team="ops", server="payroll", tool="pay_out")
    team_after_an_earlier_one("ops", last + 1, (world.olga, Membership.Role.REVIEWER))
    assert shown(world.olga) == []
    client = Client()
    client.force_login(world.olga)
    page = client.get("/").content.decode()
    assert "pay_out" not in page and "payroll" not in page and "data-grant-suggestions" not in page
    # The team's own decisions under its slug count.
    decisions("gate.approved", 3, team="ops", server="pager", tool="page")
    assert shown(world.olga) == [("ops", "pager", "page", 3)]


def test_decisions_under_a_slug_the_team_held_before_count_as_its_own(world) -> None:
    TeamSlug.objects.create(slug="release-old", team=world.release)
    decisions("gate.approved", 2, team="release-old")
    decisions("gate.approved", 1, team="release")
    assert shown(world.alice) == [("release", "deploy", "wipe", 3)]
    assert shown(world.root) == [("release", "deploy", "wipe", 3)]


def test_a_decline_under_an_earlier_slug_stops_the_suggestion(world) -> None:
    TeamSlug.objects.create(slug="release-old", team=world.release)
    decisions("gate.declined", 1, team="release-old")
    decisions("gate.approved", 4, team="release")
    assert shown(world.alice) == []


def test_a_superuser_is_not_suggested_a_retired_slug(world) -> None:
    last = decisions("gate.approved", 4, team="gone")
    TeamSlug.objects.create(slug="gone", team=None, from_id=0, until_id=last + 1)
    decisions("gate.approved", 3, team="release")
    assert shown(world.root) == [("release", "deploy", "wipe", 3)]
