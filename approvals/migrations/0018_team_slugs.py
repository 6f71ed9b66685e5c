"""A team's slug names it for good: fixed once the team exists, never given to another team.

The audit log names the team an event concerns by its slug (the chain's hashes cover it; exports show it),
and who reads an event is decided by that slug. Until now a slug could be edited, and a deleted or renamed
team's slug taken by a new team: the renamed team stopped seeing its own history, and the new team read the
old one's events. Rows of the chain cannot be rewritten, so the slug is made an identity instead:

* ``approvals_teamslug`` records, for every slug a team has held, which team its events belong to.
* A trigger refuses any change of ``approvals_team.slug`` and any new team whose slug has a row; another
  writes the new team's row as the team is inserted. Every path obeys: the admin, commands, the ORM, SQL.

Existing history is read from the configuration audit (``team.created``, ``team.changed`` with a slug
change, ``team.deleted``: each names the team's pk): a renamed team keeps its earlier slugs, and where a
slug was taken by a new team each team holds it only for the events of its own time. A slug in the log that
the history does not explain, and no team holds, is retired; a team holding a slug the history shows
another team held first reads its events only from the end of that history on (never the other's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import migrations, models

TEAM_VERBS = ("team.created", "team.changed", "team.deleted")


def slug_claims(
    history: Iterable[tuple[int, str, str, Any]], teams: Mapping[int, str], used: Iterable[str]
) -> list[dict[str, Any]]:
    """The rows of ``approvals_teamslug`` for a log whose team events (id, verb, team_slug, data, in id
    order) are `history`, whose teams are now `teams` (pk -> slug), and whose events name the slugs `used`.
    """
    claims: list[dict[str, Any]] = []
    current: dict[str, dict[str, Any]] = {}  # slug -> its open claim
    last = 0

    def claim(slug: str, team: int, at: int) -> None:
        held = current.get(slug)
        if held is not None and held["team"] == team:
            return
        if held is not None:
            held["until_id"] = at
        start = at if any(row["slug"] == slug for row in claims) else 0
        row = {"slug": slug, "team": team, "from_id": start, "until_id": None}
        claims.append(row)
        current[slug] = row

    for event_id, verb, slug, data in history:
        last = event_id
        subject = data.get("object") if isinstance(data, dict) else None
        if not isinstance(subject, dict) or subject.get("model") != "approvals.Team":
            continue
        pk = subject.get("pk")
        if not isinstance(pk, int) or isinstance(pk, bool):
            continue
        if verb == "team.changed":
            for change in data.get("changes") or []:
                if isinstance(change, dict) and change.get("field") == "slug" and change.get("new"):
                    claim(str(change["new"]), pk, event_id)
        if slug:
            claim(slug, pk, event_id)
        if verb == "team.deleted":
            for row in claims:
                if row["team"] == pk:
                    row["team"] = None  # its slugs stay retired: open, held by no team

    for pk, slug in teams.items():
        held = current.get(slug)
        if held is None or held["team"] != pk:
            # A team the history does not show taking its slug: if another team held it, this one reads the
            # slug's events only from after the history (never the other team's).
            start = last + 1 if held is not None else 0
            if held is not None:
                held["until_id"] = start
            row = {"slug": slug, "team": pk, "from_id": start, "until_id": None}
            claims.append(row)
            current[slug] = row
    for row in claims:
        if row["team"] not in teams:
            row["team"] = None
    for slug in sorted(set(used) - {row["slug"] for row in claims}):
        claims.append({"slug": slug, "team": None, "from_id": 0, "until_id": None})
    return claims


def record_claims(apps: Any, schema_editor: Any) -> None:
    Team = apps.get_model("approvals", "Team")
    TeamSlug = apps.get_model("approvals", "TeamSlug")
    AuditEvent = apps.get_model("approvals", "AuditEvent")
    history = (
        AuditEvent.objects.filter(verb__in=TEAM_VERBS)
        .order_by("id")
        .values_list("id", "verb", "team_slug", "data")
        .iterator()
    )
    teams = dict(Team.objects.values_list("pk", "slug"))
    used = AuditEvent.objects.exclude(team_slug="").values_list("team_slug", flat=True).distinct()
    rows = slug_claims(history, teams, used.iterator())
    TeamSlug.objects.bulk_create(
        TeamSlug(slug=row["slug"], team_id=row["team"], from_id=row["from_id"], until_id=row["until_id"])
        for row in rows
    )


FORWARD = """
CREATE FUNCTION approvals_team_slug_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.slug IS DISTINCT FROM OLD.slug THEN
            RAISE EXCEPTION 'a team''s slug is fixed once the team exists: % cannot become %',
                OLD.slug, NEW.slug
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM approvals_teamslug WHERE slug = NEW.slug) THEN
        RAISE EXCEPTION 'the slug % was used by a team before: a slug names one team for good', NEW.slug
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER approvals_team_slug_fixed BEFORE INSERT OR UPDATE OF slug ON approvals_team
    FOR EACH ROW EXECUTE FUNCTION approvals_team_slug_fixed();

CREATE FUNCTION approvals_team_slug_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO approvals_teamslug (slug, team_id, from_id, until_id) VALUES (NEW.slug, NEW.id, 0, NULL);
    RETURN NULL;
END
$$;

CREATE TRIGGER approvals_team_slug_claim AFTER INSERT ON approvals_team
    FOR EACH ROW EXECUTE FUNCTION approvals_team_slug_claim();
"""

BACKWARD = """
DROP TRIGGER approvals_team_slug_claim ON approvals_team;
DROP FUNCTION approvals_team_slug_claim();
DROP TRIGGER approvals_team_slug_fixed ON approvals_team;
DROP FUNCTION approvals_team_slug_fixed();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0017_round_extensions"),
    ]

    operations = [
        migrations.CreateModel(
            name="TeamSlug",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("slug", models.SlugField()),
                ("from_id", models.BigIntegerField(default=0)),
                ("until_id", models.BigIntegerField(blank=True, null=True)),
                (
                    "team",
                    models.ForeignKey(
                        null=True,
                        on_delete=models.deletion.SET_NULL,
                        related_name="slug_claims",
                        to="approvals.team",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("until_id__isnull", True)), fields=("slug",), name="teamslug_open"
                    )
                ],
            },
        ),
        migrations.RunPython(record_claims, migrations.RunPython.noop),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
