"""Remembered grants (approvals.services.grants) on the real database: what a grant covers and what it
never does, making one from an approval, using it, revoking it, and the dashboard's suggestion."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.http import QueryDict
from django.utils import timezone

from approvals import canonical
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import AuditEvent, Grant, Membership
from approvals.services import grants
from approvals.services.errors import Conflict, Forbidden, Invalid
from tests import factories

pytestmark = pytest.mark.django_db

TOOL_DIGEST = "a" * 64
ARGS = {"environment": "production", "version": "2.3.1", "options": {"force": False}}


@pytest.fixture
def world() -> Any:
    alice, bob, vera, olga = (factories.user(name) for name in ("alice", "bob", "vera", "olga"))
    release = factories.team(
        "release",
        (alice, Membership.Role.REVIEWER),
        (bob, Membership.Role.ADMIN),
        (vera, Membership.Role.VIEWER),
    )
    ops = factories.team("ops", (olga, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    other_agent, _ = factories.agent("other-bot", servers=[deploy])
    return SimpleNamespace(**locals())


def a_call(world: Any, **extra: Any) -> Any:
    return factories.call(
        world.deploy,
        extra.pop("agent", world.agent),
        tool=extra.pop("tool", "create_deployment"),
        arguments=extra.pop("arguments", ARGS),
        **extra,
    )


def grant_for(world: Any, choice: dict[str, Any], **extra: Any) -> Grant:
    return grants.create_from_approval(
        approver=world.alice,
        call=extra.pop("call", None) or a_call(world),
        tool_digest=TOOL_DIGEST,
        choice=choice,
        **extra,
    )


EXACT = {"for": "8h", "arguments": "exact"}
ON_PRODUCTION = {
    "for": "until_revoked",
    "arguments": "conditions",
    "conditions": [{"argument": "environment", "op": "==", "value": "production"}],
}


# --- matching -----------------------------------------------------------------------------------------------


def test_an_exact_grant_covers_the_same_arguments_in_any_key_order(world) -> None:
    grant = grant_for(world, EXACT)
    reordered = {"options": {"force": False}, "version": "2.3.1", "environment": "production"}
    assert grants.find(call=a_call(world, arguments=reordered), tool_digest=TOOL_DIGEST) == grant


def test_an_exact_grant_does_not_cover_other_arguments(world) -> None:
    grant_for(world, EXACT)
    for changed in (
        {**ARGS, "version": "2.3.2"},
        {**ARGS, "options": {"force": True}},
        {**ARGS, "extra": 1},
        {key: value for key, value in ARGS.items() if key != "version"},
    ):
        assert grants.find(call=a_call(world, arguments=changed), tool_digest=TOOL_DIGEST) is None


def test_a_grant_on_conditions_covers_any_arguments_meeting_them(world) -> None:
    grant = grant_for(world, ON_PRODUCTION)
    other_version = a_call(world, arguments={"environment": "production", "version": "9.9"})
    assert grants.find(call=other_version, tool_digest=TOOL_DIGEST) == grant
    staging = a_call(world, arguments={"environment": "staging", "version": "2.3.1"})
    assert grants.find(call=staging, tool_digest=TOOL_DIGEST) is None
    missing = a_call(world, arguments={"version": "2.3.1"})
    assert grants.find(call=missing, tool_digest=TOOL_DIGEST) is None


def test_conditions_on_nested_arguments_and_lists(world) -> None:
    choice = {
        "for": "1h",
        "arguments": "conditions",
        "conditions": [
            {"argument": "environment", "op": "in", "value": ["production", "staging"]},
            {"argument": "options.force", "op": "==", "value": False},
        ],
    }
    grant = grant_for(world, choice)
    staging = a_call(world, arguments={"environment": "staging", "options": {"force": False}})
    assert grants.find(call=staging, tool_digest=TOOL_DIGEST) == grant
    forced = a_call(world, arguments={"environment": "staging", "options": {"force": True}})
    assert grants.find(call=forced, tool_digest=TOOL_DIGEST) is None


def test_an_expired_grant_never_matches(world) -> None:
    grant = grant_for(world, EXACT)
    Grant.objects.filter(pk=grant.pk).update(
        created_at=timezone.now() - timedelta(hours=9), expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert grants.find(call=a_call(world), tool_digest=TOOL_DIGEST) is None
    grant.refresh_from_db()
    assert grant.state() == "expired"


def test_a_revoked_grant_never_matches(world) -> None:
    grant = grant_for(world, ON_PRODUCTION)
    grants.revoke(grant=grant, by=world.alice)
    assert grants.find(call=a_call(world), tool_digest=TOOL_DIGEST) is None


def test_another_agent_gets_nothing_from_the_grant(world) -> None:
    grant_for(world, ON_PRODUCTION)
    assert grants.find(call=a_call(world, agent=world.other_agent), tool_digest=TOOL_DIGEST) is None


def test_the_grant_is_for_one_person(world) -> None:
    grant_for(world, EXACT, call=a_call(world, on_behalf_of=world.vera))
    assert grants.find(call=a_call(world, on_behalf_of=world.vera), tool_digest=TOOL_DIGEST) is not None
    assert grants.find(call=a_call(world, on_behalf_of=world.olga), tool_digest=TOOL_DIGEST) is None
    assert grants.find(call=a_call(world), tool_digest=TOOL_DIGEST) is None  # for no one


def test_a_grant_for_no_one_does_not_cover_calls_for_someone(world) -> None:
    grant_for(world, EXACT)
    assert grants.find(call=a_call(world, on_behalf_of=world.vera), tool_digest=TOOL_DIGEST) is None


def test_a_changed_tool_definition_is_not_covered(world) -> None:
    grant_for(world, ON_PRODUCTION)
    assert grants.find(call=a_call(world), tool_digest="b" * 64) is None


def test_another_tool_is_not_covered(world) -> None:
    grant_for(world, ON_PRODUCTION)
    assert grants.find(call=a_call(world, tool="delete_deployment"), tool_digest=TOOL_DIGEST) is None


def test_exact_grants_are_preferred_to_conditions(world) -> None:
    grant_for(world, ON_PRODUCTION)
    exact = grant_for(world, EXACT)
    assert grants.find(call=a_call(world), tool_digest=TOOL_DIGEST) == exact


def test_a_malformed_stored_condition_matches_nothing(world) -> None:
    grant = grant_for(world, ON_PRODUCTION)
    Grant.objects.filter(pk=grant.pk).update(conditions=[{"argument": "environment", "op": "~="}])
    assert grants.find(call=a_call(world), tool_digest=TOOL_DIGEST) is None


# --- making one ---------------------------------------------------------------------------------------------


def test_a_grant_remembers_who_what_and_until_when_and_is_audited(world) -> None:
    call = a_call(world, on_behalf_of=world.vera)
    before = timezone.now()
    grant = grant_for(world, EXACT, call=call)
    assert grant.agent == world.agent and grant.on_behalf_of == world.vera and grant.server == world.deploy
    assert grant.team == world.release and grant.granted_by == world.alice and grant.source_call == call
    assert grant.arguments == ARGS and grant.arguments_digest == canonical.digest(ARGS)
    assert timedelta(hours=8) <= grant.expires_at - before < timedelta(hours=8, seconds=30)
    event = AuditEvent.objects.get(verb="grant.created")
    assert event.call_id == call.pk and event.team_slug == "release" and event.actor_label == "alice"
    assert event.tool == "create_deployment" and event.server_slug == "deploy"
    assert event.data["grant"] == str(grant.pk) and event.data["for"] == "8h"


def test_until_revoked_has_no_expiry_and_one_hour_has_one(world) -> None:
    assert grant_for(world, {"for": "until_revoked", "arguments": "exact"}).expires_at is None
    one_hour = grant_for(world, {"for": "1h", "arguments": "exact"})
    assert timedelta(minutes=59) < one_hour.expires_at - one_hour.created_at <= timedelta(hours=1)


def test_the_audit_log_never_holds_a_secret_condition_value(world) -> None:
    call = a_call(world, arguments={"environment": "production", "api_key": "sk-live-123"})
    choice = {
        "for": "1h",
        "arguments": "conditions",
        "conditions": [
            {"argument": "api_key", "value": "sk-live-123"},
            {"argument": "environment", "value": "production"},
        ],
    }
    grant_for(world, choice, call=call)
    event = AuditEvent.objects.get(verb="grant.created")
    assert "sk-live-123" not in str(event.data)
    assert event.data["conditions"] == [
        {"argument": "api_key", "op": "==", "value": audit.REDACTED},
        {"argument": "environment", "op": "==", "value": "production"},
    ]


def test_the_approved_arguments_are_granted_not_the_asked_ones(world) -> None:
    edited = {**ARGS, "version": "2.3.0"}
    grant_for(world, EXACT, arguments=edited)
    assert grants.find(call=a_call(world, arguments=edited), tool_digest=TOOL_DIGEST) is not None
    assert grants.find(call=a_call(world), tool_digest=TOOL_DIGEST) is None


def test_conditions_must_hold_for_the_approved_call(world) -> None:
    staging = {
        "for": "1h",
        "arguments": "conditions",
        "conditions": [{"argument": "environment", "value": "staging"}],
    }
    with pytest.raises(Invalid) as raised:
        grant_for(world, staging)
    assert raised.value.code == "invalid_grant" and "grant.conditions" in raised.value.fields
    assert not Grant.objects.exists()
    assert not AuditEvent.objects.filter(verb="grant.created").exists()


def test_the_team_is_the_one_the_gate_was_routed_to(world) -> None:
    call = a_call(world)
    factories.open_round(call, team_=world.ops)
    assert grant_for(world, EXACT, call=call).team == world.ops


def test_a_call_routed_to_no_team_cannot_be_granted(world) -> None:
    world.deploy.default_team = None
    world.deploy.save()
    with pytest.raises(Invalid):
        grant_for(world, EXACT)


def test_the_database_refuses_a_grant_without_its_arguments(world) -> None:
    grant = grant_for(world, EXACT)
    with pytest.raises(IntegrityError), transaction.atomic():
        Grant.objects.filter(pk=grant.pk).update(arguments_digest="")


# --- the choice, from the API and from the approve form -----------------------------------------------------


def test_parse_choice_reads_the_api_object() -> None:
    assert grants.parse_choice(None) is None
    assert grants.parse_choice({"for": "1h"}) == {"for": "1h", "arguments": "exact", "conditions": []}
    assert grants.parse_choice(ON_PRODUCTION) == {
        "for": "until_revoked",
        "arguments": "conditions",
        "conditions": [{"argument": "environment", "op": "==", "value": "production"}],
    }


@pytest.mark.parametrize(
    ("choice", "field"),
    [
        ("8h", "grant"),
        ({"for": "forever"}, "grant.for"),
        ({"for": "1h", "arguments": "similar"}, "grant.arguments"),
        ({"for": "1h", "arguments": "conditions"}, "grant.conditions"),
        ({"for": "1h", "arguments": "conditions", "conditions": [{"op": "=="}]}, "grant.conditions"),
        (
            {"for": "1h", "arguments": "conditions", "conditions": [{"argument": "a", "op": "like"}]},
            "grant.conditions",
        ),
        (
            {
                "for": "1h",
                "arguments": "conditions",
                "conditions": [{"argument": "a", "op": "in", "value": 1}],
            },
            "grant.conditions",
        ),
        ({"for": "1h", "arguments": "conditions", "conditions": [{"argument": "a"}]}, "grant.conditions"),
        (
            {"for": "1h", "arguments": "conditions", "conditions": [{"argument": "a", "value": "x" * 3000}]},
            "grant.conditions",
        ),
        (
            {"for": "1h", "arguments": "conditions", "conditions": [{"argument": "a", "value": 2**60}]},
            "grant.conditions",
        ),
        (
            {
                "for": "1h",
                "arguments": "conditions",
                "conditions": [{"argument": f"a{i}", "value": 1} for i in range(21)],
            },
            "grant.conditions",
        ),
        ({"for": "1h", "until": "tomorrow"}, "grant"),
        # Values JSON allows where a name is expected: refused, never a TypeError (a list is no dict key).
        ({"for": []}, "grant.for"),
        ({"for": {}}, "grant.for"),
        ({"for": "1h", "arguments": []}, "grant.arguments"),
        ({"for": "1h", "arguments": {"a": 1}}, "grant.arguments"),
    ],
)
def test_parse_choice_refuses_what_it_cannot_honour(choice: Any, field: str) -> None:
    with pytest.raises(Invalid) as raised:
        grants.parse_choice(choice)
    assert raised.value.code == "invalid_grant" and field in raised.value.fields
    assert raised.value.message


def test_parse_choice_reads_the_approve_form() -> None:
    assert grants.parse_choice(QueryDict("action=accept&grant_for=")) is None
    assert grants.parse_choice(QueryDict("action=accept")) is None
    form = QueryDict(mutable=True)
    form.update({"grant_for": "8h", "grant_arguments": "conditions"})
    form.setlist("grant_condition", ['{"argument": "environment", "op": "==", "value": "production"}'])
    assert grants.parse_choice(form) == {
        "for": "8h",
        "arguments": "conditions",
        "conditions": [{"argument": "environment", "op": "==", "value": "production"}],
    }
    form.setlist("grant_condition", ["{not json"])
    with pytest.raises(Invalid):
        grants.parse_choice(form)


# --- using and revoking -------------------------------------------------------------------------------------


def test_using_a_grant_counts_it_and_audits_the_call_as_granted(world) -> None:
    grant = grant_for(world, ON_PRODUCTION)
    call = a_call(world)
    found = grants.find(call=call, tool_digest=TOOL_DIGEST)
    assert found is not None
    grants.use(found, call)
    grants.use(found, a_call(world))
    grant.refresh_from_db()
    assert grant.uses == 2 and grant.last_used_at is not None
    event = AuditEvent.objects.filter(verb="gate.granted").order_by("id").first()
    assert event.call_id == call.pk and event.actor_type == "system" and event.team_slug == "release"
    assert event.data == {
        "grant": str(grant.pk),
        "server": "deploy",
        "tool": "create_deployment",
        "team": "release",
    }


def test_a_grant_revoked_after_it_was_found_is_not_used(world) -> None:
    grant = grant_for(world, EXACT)
    call = a_call(world)
    found = grants.find(call=call, tool_digest=TOOL_DIGEST)
    grants.revoke(grant=grant, by=world.bob)
    with pytest.raises(Conflict):
        grants.use(found, call)
    assert not AuditEvent.objects.filter(verb="gate.granted").exists()


def test_find_inside_a_transaction_locks_the_grant_against_a_racing_revoke(world) -> None:
    grant_for(world, EXACT)
    with transaction.atomic():
        found = grants.find(call=a_call(world), tool_digest=TOOL_DIGEST)
        assert found is not None
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE c.relname = 'approvals_grant' AND l.mode = 'RowShareLock' AND l.pid = pg_backend_pid()"
            )
            assert cursor.fetchone()[0] == 1


def test_lapsed_locks_the_grant_against_a_racing_revoke_and_says_why_it_lapsed(world) -> None:
    grant = grant_for(world, EXACT)
    call = a_call(world)
    grants.use(grant, call)
    assert call.grant_id == grant.pk
    with transaction.atomic():
        assert grants.lapsed(call=call, tool_digest=TOOL_DIGEST) is None
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE c.relname = 'approvals_grant' AND l.mode = 'RowShareLock' AND l.pid = pg_backend_pid()"
            )
            assert cursor.fetchone()[0] == 1
    assert grants.lapsed(call=call, tool_digest="b" * 64) == (
        "the tool's definition changed on the server since the grant let it through"
    )
    grants.revoke(grant=grant, by=world.bob)
    assert grants.lapsed(call=call, tool_digest=TOOL_DIGEST).startswith(
        "the grant that let it through was revoked by bob"
    )


def test_a_reviewer_of_the_team_revokes_and_it_is_audited(world) -> None:
    grant = grant_for(world, ON_PRODUCTION)
    grants.revoke(grant=grant, by=world.bob)
    grant.refresh_from_db()
    assert grant.state() == "revoked" and grant.revoked_by == world.bob
    event = AuditEvent.objects.get(verb="grant.revoked")
    assert (
        event.actor_label == "bob" and event.team_slug == "release" and event.data["grant"] == str(grant.pk)
    )


def test_viewers_and_other_teams_cannot_revoke(world) -> None:
    grant = grant_for(world, ON_PRODUCTION)
    for outsider in (world.vera, world.olga):
        with pytest.raises(Forbidden):
            grants.revoke(grant=grant, by=outsider)
    grant.refresh_from_db()
    assert grant.state() == "active"
    superuser = factories.user("root", is_superuser=True)
    grants.revoke(grant=grant, by=superuser)


def test_revoking_twice_says_who_revoked_it_first(world) -> None:
    grant = grant_for(world, EXACT)
    grants.revoke(grant=grant, by=world.alice)
    with pytest.raises(Conflict) as raised:
        grants.revoke(grant=grant, by=world.bob)
    assert "revoked by alice" in raised.value.message
    assert AuditEvent.objects.filter(verb="grant.revoked").count() == 1


def test_listing_scopes_and_filters(world) -> None:
    mine = grant_for(world, EXACT)
    theirs = grant_for(world, EXACT, call=a_call(world, agent=world.other_agent))
    revoked = grant_for(world, ON_PRODUCTION)
    grants.revoke(grant=revoked, by=world.alice)
    assert set(grants.listing(agent=world.agent)) == {mine, revoked}
    assert set(grants.listing(user=world.vera)) == {mine, theirs, revoked}  # viewers see, cannot revoke
    assert list(grants.listing(user=world.olga)) == []
    active = grants.listing(user=world.alice, filters=grants.Filters(state="active", agent="ci-bot"))
    assert list(active) == [mine]
    assert list(grants.listing(user=world.alice, filters=grants.Filters(state="revoked"))) == [revoked]
    assert list(grants.listing(user=world.alice, filters=grants.Filters(tool="other"))) == []


# --- the dashboard's suggestion -----------------------------------------------------------------------------


def gate_decisions(
    world: Any,
    verb: str,
    count: int,
    *,
    team: str = "release",
    tool: str = "create_deployment",
    days_ago: float = 0,
) -> None:
    at = timezone.now() - timedelta(days=days_ago)
    audit.append_many(
        [
            {
                "at": at,
                "actor_type": "user",
                "actor_id": str(world.alice.pk),
                "actor_label": "alice",
                "verb": verb,
                "server_slug": "deploy",
                "team_slug": team,
                "tool": tool,
                "data": {"server": "deploy", "tool": tool, "team": team},
            }
            for _ in range(count)
        ]
    )


def test_a_tool_approved_often_and_never_declined_is_suggested(world, settings) -> None:
    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 20
    gate_decisions(world, "gate.approved", 20)
    gate_decisions(world, "gate.approved", 19, tool="rollback")
    suggested = grants.suggestions(world.alice)
    assert [(s.team, s.server, s.tool, s.approvals) for s in suggested] == [
        ("release", "deploy", "create_deployment", 20)
    ]
    assert grants.suggestions(world.olga) == []  # not their team


def test_one_decline_in_the_window_stops_the_suggestion(world, settings) -> None:
    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 3
    gate_decisions(world, "gate.approved", 5)
    gate_decisions(world, "gate.declined", 1)
    assert grants.suggestions(world.alice) == []


def test_decisions_older_than_the_window_do_not_count(world, settings) -> None:
    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 3
    settings.ELICIT_GRANT_SUGGEST_DAYS = 14
    gate_decisions(world, "gate.declined", 1, days_ago=15)
    gate_decisions(world, "gate.approved", 2, days_ago=15)
    gate_decisions(world, "gate.approved", 3)
    assert [s.approvals for s in grants.suggestions(world.alice)] == [3]
    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 4
    assert grants.suggestions(world.alice) == []


def test_the_suggestion_is_one_query_on_the_gate_decisions_index(
    world, settings, django_assert_num_queries
) -> None:
    settings.ELICIT_GRANT_SUGGEST_APPROVALS = 1
    gate_decisions(world, "gate.approved", 1)
    with django_assert_num_queries(2):  # the user's teams, then the counts
        assert len(grants.suggestions(world.alice)) == 1
    from django.db import connection

    with connection.cursor() as cursor:
        # A history as a deployment has one (thousands of other events in the window, statistics kept by
        # autovacuum): on a table of a few test rows the planner's choice between this index and the one on
        # `at` alone is a coin toss that depends on what other tests wrote. Rolled back with the test.
        cursor.execute(
            "INSERT INTO approvals_auditevent (at, actor_type, actor_id, actor_label, verb, server_slug,"
            " team_slug, tool, action, outcome, data, prev_hash, hash)"
            " SELECT now() - g * interval '1 minute', 'system', '', 'system', 'call.completed', 'demo',"
            " 'release', 'deploy', '', '', '{}', '', 'bulk-' || g FROM generate_series(1, 20000) g"
        )
        cursor.execute("ANALYZE approvals_auditevent")
        cursor.execute("SET LOCAL enable_seqscan = off")
        query = grants.suggestion_query(["release"]).query
        sql, params = query.sql_with_params()
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "audit_gate_decisions_idx" in plan


def test_audit_record_knows_the_grant_verbs(world) -> None:
    for verb in ("grant.created", "grant.revoked", "gate.granted"):
        audit.record(actor=Actor.system(), verb=verb, data={"grant": "x"})
