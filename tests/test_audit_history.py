"""The audit page: search, filters and their combinations, keyset pagination, live arrival, permissions,
call timelines, analytics and the chain's state."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals import schema_forms
from approvals.audit import core as audit
from approvals.audit import queries as audit_queries
from approvals.audit import tasks as audit_tasks
from approvals.audit.core import Actor
from approvals.models import AgentClient, AuditEvent, InputRequest, Membership, ToolCall
from approvals.permissions import visible_audit_events
from approvals.services import calls
from tests import factories

pytestmark = pytest.mark.django_db

EVENT_ID = re.compile(r'data-event-id="(\d+)"')


@dataclass
class Seeded:
    """Ten events on two calls of two teams, labelled so the tables below read as behaviour."""

    ids: dict[str, int]
    deploy_call: ToolCall
    k8s_call: ToolCall
    deploy_ir: InputRequest
    k8s_ir: InputRequest
    persian_ir: InputRequest
    middle_at: Any

    def label(self, event_id: int) -> str:
        return {v: k for k, v in self.ids.items()}[event_id]


def plain_agent(name: str, server: Any) -> AgentClient:
    """A bare row: tokens.agent_create would audit agent.created, and the log holds only the seeded events."""
    agent = AgentClient.objects.create(name=name, token_hash=name, token_prefix=name[:10])
    agent.servers.set([server])
    return agent


@pytest.fixture
def seeded() -> Seeded:
    release, platform = factories.team("release"), factories.team("platform")
    deploy = factories.server("deploy", default_team=release)
    k8s = factories.server("k8s", default_team=platform)
    ci, ops = plain_agent("ci-bot", deploy), plain_agent("ops-bot", k8s)
    alice, bob = factories.user("alice"), factories.user("bob")
    deploy_call = factories.call(deploy, ci, arguments={"environment": "production"})
    k8s_call = factories.call(k8s, ops, tool="scale_deployment", arguments={"replicas": 3})
    deploy_ir = factories.open_round(deploy_call, team_=release).input_requests.get()
    k8s_round = factories.open_round(k8s_call, keys=("replicas", "confirm"), team_=platform)
    k8s_ir, persian_ir = k8s_round.input_requests.order_by("key").reverse()
    system = Actor.system()
    ids: dict[str, int] = {}

    def rec(label: str, **kwargs: Any) -> None:
        ids[label] = audit.record(**kwargs).id

    rec(
        "deploy.submitted",
        actor=Actor.agent(ci),
        verb="call.submitted",
        call=deploy_call,
        data={"tool": "create_deployment", "arguments": {"environment": "production"}},
    )
    rec(
        "deploy.requested",
        actor=system,
        verb="input.requested",
        call=deploy_call,
        input_request=deploy_ir,
        data={"key": "environment", "mode": "form", "message": "Deploy checkout 2.3.1 to production?"},
    )
    rec(
        "deploy.declined",
        actor=Actor.user(alice),
        verb="input.answered",
        call=deploy_call,
        input_request=deploy_ir,
        data={
            "key": "environment",
            "action": "decline",
            "content": None,
            "reason": "Change freeze until Monday",
        },
    )
    rec(
        "deploy.round",
        actor=system,
        verb="round.answered",
        call=deploy_call,
        data={"round": 1, "outcome": "answered"},
    )
    rec("deploy.completed", actor=system, verb="call.completed", call=deploy_call, data={"is_error": False})
    middle_at = timezone.now()
    rec(
        "k8s.submitted",
        actor=Actor.agent(ops),
        verb="call.submitted",
        call=k8s_call,
        data={"tool": "scale_deployment", "arguments": {"replicas": 3}},
    )
    rec(
        "k8s.requested",
        actor=system,
        verb="input.requested",
        call=k8s_call,
        input_request=k8s_ir,
        data={"key": "replicas", "mode": "form", "message": "Soll payments in staging skaliert werden?"},
    )
    rec(
        "k8s.accepted",
        actor=Actor.user(bob),
        verb="input.answered",
        call=k8s_call,
        input_request=k8s_ir,
        data={
            "key": "replicas",
            "action": "accept",
            "content": {"replicas": 3, "password": "hunter2"},
            "reason": "",
        },
    )
    rec(
        "k8s.persian",
        actor=system,
        verb="input.requested",
        call=k8s_call,
        input_request=persian_ir,
        data={"key": "confirm", "mode": "form", "message": "آیا نسخه جدید منتشر شود؟"},
    )
    rec(
        "k8s.expired",
        actor=system,
        verb="input.expired",
        call=k8s_call,
        input_request=persian_ir,
        data={"key": "confirm"},
    )
    rec(
        "k8s.failed",
        actor=system,
        verb="call.failed",
        call=k8s_call,
        data={"error": {"code": "timeout", "message": "The server did not answer within 30 s"}},
    )
    return Seeded(ids, deploy_call, k8s_call, deploy_ir, k8s_ir, persian_ir, middle_at)


DEPLOY = {"deploy.submitted", "deploy.requested", "deploy.declined", "deploy.round", "deploy.completed"}
K8S = {"k8s.submitted", "k8s.requested", "k8s.accepted", "k8s.persian", "k8s.expired", "k8s.failed"}

# (filters, or a function of the seeded set giving them) -> the labels of the events expected
CASES: list[tuple[str, Any, set[str]]] = [
    ("no filter", {}, DEPLOY | K8S),
    (
        "a word in the arguments and the message",
        {"q": "production"},
        {"deploy.submitted", "deploy.requested"},
    ),
    ("a phrase in a reason", {"q": '"change freeze"'}, {"deploy.declined"}),
    ("a phrase in the wrong order finds nothing", {"q": '"freeze change"'}, set()),
    ("a word, minus another", {"q": "freeze -monday"}, set()),
    (
        "either word",
        {"q": "skaliert or production"},
        {"k8s.requested", "deploy.submitted", "deploy.requested"},
    ),
    ("a German word", {"q": "skaliert"}, {"k8s.requested"}),
    ("a Persian word", {"q": "منتشر"}, {"k8s.persian"}),
    ("a reviewer's name", {"q": "alice"}, {"deploy.declined"}),
    ("an error message", {"q": "answer within"}, {"k8s.failed"}),
    ("a redacted secret is not searchable", {"q": "hunter2"}, set()),
    ("case does not matter", {"q": "PRODUCTION"}, {"deploy.submitted", "deploy.requested"}),
    ("a call id", lambda s: {"q": str(s.k8s_call.pk)}, K8S),
    ("an input request id", lambda s: {"q": str(s.persian_ir.pk)}, {"k8s.persian", "k8s.expired"}),
    ("an event number", lambda s: {"q": f"#{s.ids['deploy.round']}"}, {"deploy.round"}),
    ("team", {"team": "release"}, DEPLOY),
    ("server", {"server": "k8s"}, K8S),
    ("tool", {"tool": "scale_deployment"}, K8S),
    ("verb", {"verb": "input.answered"}, {"deploy.declined", "k8s.accepted"}),
    (
        "every verb of a kind",
        {"verb": "input.*"},
        {"deploy.requested", "deploy.declined"} | K8S - {"k8s.submitted", "k8s.failed"},
    ),
    ("action", {"action": "decline"}, {"deploy.declined"}),
    ("outcome expired", {"outcome": "expired"}, {"k8s.expired"}),
    ("outcome failed", {"outcome": "failed"}, {"k8s.failed"}),
    ("outcome answered", {"outcome": "answered"}, {"deploy.declined", "deploy.round", "k8s.accepted"}),
    ("actor", {"actor": "bob"}, {"k8s.accepted"}),
    ("actor type", {"actor_type": "agent"}, {"deploy.submitted", "k8s.submitted"}),
    ("call", lambda s: {"call": str(s.deploy_call.pk)}, DEPLOY),
    ("input request", lambda s: {"input_request": str(s.k8s_ir.pk)}, {"k8s.requested", "k8s.accepted"}),
    ("since", lambda s: {"since": s.middle_at.isoformat()}, K8S),
    ("until", lambda s: {"until": s.middle_at.isoformat()}, DEPLOY),
    ("team and verb", {"team": "platform", "verb": "input.answered"}, {"k8s.accepted"}),
    ("search and verb", {"q": "production", "verb": "call.submitted"}, {"deploy.submitted"}),
    ("search and team that disagree", {"q": "production", "team": "platform"}, set()),
    ("server, kind and outcome", {"server": "k8s", "verb": "call.*", "outcome": "failed"}, {"k8s.failed"}),
    ("search and a time range", lambda s: {"q": "deployment", "until": s.middle_at.isoformat()}, DEPLOY),
    ("actor type and action", {"actor_type": "user", "action": "accept"}, {"k8s.accepted"}),
]


def page_ids(client: Client, params: dict[str, Any]) -> list[int]:
    response = client.get(reverse("audit:index"), params)
    assert response.status_code == 200, response.content.decode()[:2000]
    return [int(i) for i in EVENT_ID.findall(response.content.decode())]


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


@pytest.mark.parametrize(("name", "filters", "expected"), CASES, ids=[case[0] for case in CASES])
def test_search_and_filters_return_the_right_events(
    root: Client, seeded: Seeded, name: str, filters: Any, expected: set[str]
) -> None:
    params = filters(seeded) if callable(filters) else filters
    ids = page_ids(root, params)
    assert {seeded.label(i) for i in ids} == expected
    assert ids == sorted(ids, reverse=True)  # newest first


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"since": "yesterday"}, "Enter a valid date/time."),
        ({"call": "not-a-uuid"}, "Enter a valid UUID."),
        ({"verb": "call.exploded"}, "Select a valid choice."),
        ({"since": "2026-02-01T00:00", "until": "2026-01-01T00:00"}, "must be earlier than"),
        ({"before": "-3"}, "greater than or equal to 1"),
        ({"team": "not a slug!"}, "Enter a valid “slug”"),
    ],
)
def test_bad_filters_get_a_readable_message_not_an_error_page(
    root: Client, params: dict[str, str], message: str
) -> None:
    response = root.get(reverse("audit:index"), params)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert "There is a problem with the filters" in response.content.decode()


def test_pages_neither_repeat_nor_skip_events_while_new_ones_arrive(root: Client, monkeypatch) -> None:
    monkeypatch.setattr(audit_queries, "PAGE_SIZE", 4)
    first = [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"n": n}).id for n in range(10)
    ]
    seen: list[int] = []
    response = root.get(reverse("audit:index"))
    while True:
        body = response.content.decode()
        seen += [int(i) for i in EVENT_ID.findall(body)]
        # Events keep arriving between page loads; they belong above the first page, not in older pages.
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"late": True})
        older = re.search(r'href="[^"]*before=(\d+)"[^>]*data-older', body)
        if not older:
            break
        response = root.get(reverse("audit:index"), {"before": older.group(1)})
    assert seen == sorted(first, reverse=True)


def test_new_events_matching_the_filters_arrive_through_the_poll(root: Client, seeded: Seeded) -> None:
    body = root.get(reverse("audit:index"), {"team": "platform"}).content.decode()
    newest = int(re.search(r'data-newest="(\d+)"', body).group(1))
    assert newest == seeded.ids["k8s.failed"]
    k8s_call = seeded.k8s_call
    matching = audit.record(actor=Actor.system(), verb="call.retry_scheduled", call=k8s_call, data={"n": 1})
    audit.record(actor=Actor.system(), verb="call.retry_scheduled", call=seeded.deploy_call, data={"n": 2})
    response = root.get(reverse("audit:newer"), {"team": "platform", "after": newest})
    assert [int(i) for i in EVENT_ID.findall(response.content.decode())] == [matching.id]
    after = int(response["X-Audit-Newest"])
    assert after > matching.id  # the deploy event is past too, so the next poll does not read it again
    again = root.get(reverse("audit:newer"), {"team": "platform", "after": after})
    assert EVENT_ID.findall(again.content.decode()) == []
    assert again["X-Audit-Count"] == "0"


# --- who sees what ---------------------------------------------------------------------------------


def test_members_see_only_their_teams_events(seeded: Seeded) -> None:
    viewer = factories.user("vera")
    Membership.objects.create(team=seeded.deploy_ir.team, user=viewer, role=Membership.Role.VIEWER)
    visible = set(visible_audit_events(viewer).values_list("id", flat=True))
    assert {seeded.label(i) for i in visible} == DEPLOY


def test_unrouted_events_of_a_call_routed_to_a_team_are_that_teams(seeded: Seeded) -> None:
    viewer = factories.user("vera")
    Membership.objects.create(team=seeded.k8s_ir.team, user=viewer, role=Membership.Role.REVIEWER)
    routed_call = factories.call(factories.server("misc"))  # no default team: its call events are unrouted
    factories.open_round(routed_call, team_=seeded.k8s_ir.team)
    unrouted = audit.record(actor=Actor.system(), verb="call.cancelled", call=routed_call)
    stray = audit.record(
        actor=Actor.system(), verb="call.cancelled", call=factories.call(factories.server("x"))
    )
    assert AuditEvent.objects.get(pk=unrouted.pk).team_slug == ""
    visible = set(visible_audit_events(viewer).values_list("id", flat=True))
    assert unrouted.id in visible and stray.id not in visible


def test_call_events_carry_the_team_of_the_calls_server(seeded: Seeded) -> None:
    event = audit.record(actor=Actor.system(), verb="call.cancelled", call=seeded.k8s_call)
    assert AuditEvent.objects.get(pk=event.pk).team_slug == "platform"


def test_outsiders_see_nothing_and_staff_also_see_unrouted_events(seeded: Seeded) -> None:
    stray = audit.record(
        actor=Actor.system(), verb="call.cancelled", call=factories.call(factories.server("x"))
    )
    outsider, staff = factories.user("olga"), factories.user("sam", is_staff=True)
    assert not visible_audit_events(outsider).exists()
    assert list(visible_audit_events(staff).values_list("id", flat=True)) == [stray.id]


def test_the_page_search_is_scoped_to_what_the_user_may_see(client: Client, seeded: Seeded) -> None:
    viewer = factories.user("vera")
    Membership.objects.create(team=seeded.k8s_ir.team, user=viewer, role=Membership.Role.VIEWER)
    client.force_login(viewer)
    assert page_ids(client, {"q": "production"}) == []
    assert {seeded.label(i) for i in page_ids(client, {})} == K8S
    timeline = client.get(reverse("audit:call_timeline", args=[seeded.deploy_call.pk]))
    assert timeline.status_code == 404


def test_anonymous_users_are_sent_to_log_in(client: Client) -> None:
    response = client.get(reverse("audit:index"))
    assert response.status_code == 302 and "login" in response["Location"]


# --- the call timeline -----------------------------------------------------------------------------


def test_the_timeline_shows_what_reviewers_saw_and_sent_and_what_the_server_said(
    root: Client, seeded: Seeded
) -> None:
    ToolCall.objects.filter(pk=seeded.k8s_call.pk).update(
        status=ToolCall.Status.FAILED, error={"code": "timeout", "message": "no answer", "token": "T0P"}
    )
    body = root.get(reverse("audit:call_timeline", args=[seeded.k8s_call.pk])).content.decode()
    order = [m.group(1) for m in re.finditer(r'data-verb="([a-z_.]+)"', body)]
    assert order == [
        "call.submitted",
        "input.requested",
        "input.answered",
        "input.requested",
        "input.expired",
        "call.failed",
    ]
    assert "Soll payments in staging skaliert werden?" in body
    assert schema_forms.fingerprint(factories.ENVIRONMENT_SCHEMA)[:12] in body  # the schema version shown
    assert "[redacted]" in body and "hunter2" not in body  # what was sent, secrets redacted
    assert "no answer" in body and "T0P" not in body  # the server's answer, secrets redacted
    assert seeded.k8s_call.pk.hex[:8] in body


def test_the_timeline_shows_the_audited_fingerprint_of_a_non_ascii_schema(root: Client) -> None:
    """One fingerprint: the version the timeline shows is the audited schema_sha256, accents and all."""
    ag, _ = factories.agent()
    schema = {
        "type": "object",
        "properties": {"größe": {"type": "string", "title": "Größe — 大きさ"}},
        "required": ["größe"],
    }
    call, _ = calls.relay_submit(
        agent=ag,
        server_slug="elsewhere",
        tool="resize",
        arguments={},
        input_requests={
            "size": {
                "method": "elicitation/create",
                "params": {"mode": "form", "message": "Welche Größe?", "requestedSchema": schema},
            }
        },
    )
    audited = AuditEvent.objects.get(call_id=call.pk, verb="input.requested").data["schema_sha256"]
    assert audited == schema_forms.fingerprint(schema)
    body = root.get(reverse("audit:call_timeline", args=[call.pk])).content.decode()
    assert audited[:12] in body


def test_an_unknown_call_has_no_timeline(root: Client) -> None:
    assert root.get(reverse("audit:call_timeline", args=[uuid4()])).status_code == 404


# --- analytics and the chain's state -------------------------------------------------------------


def test_analytics_give_time_to_decision_and_rates_per_team(seeded: Seeded) -> None:
    now = timezone.now()
    minutes = [2, 4, 6, 8, 100]
    for i, m in enumerate(minutes):
        rnd = factories.open_round(factories.call(seeded.deploy_call.server), team_=seeded.deploy_ir.team)
        action = "decline" if i == 0 else "accept"
        rnd.input_requests.update(
            status="answered",
            action=action,
            created_at=now - timedelta(minutes=m),
            answered_at=now,
            content={"environment": "staging"} if action == "accept" else None,
        )
    expired = factories.open_round(factories.call(seeded.deploy_call.server), team_=seeded.deploy_ir.team)
    expired.input_requests.update(status="expired", action="cancel", answered_at=now)
    superuser = factories.user("stats", is_superuser=True)
    stats = audit_queries.analytics(superuser)
    release = next(row for row in stats["by_team"] if row["group"] == "release")
    assert release["median"] == "6 min 0 s"
    assert release["p90"] == "1 h 3 min"  # 8 + 0.6 * (100 - 8) = 63.2 minutes
    assert release["answered"] == 5
    assert release["decline_rate"] == "20 %"
    assert release["expiry_rate"] == "17 %"  # 1 of 6
    assert release["waiting"] == 1  # the seeded deploy request is still pending
    platform = next(row for row in stats["by_team"] if row["group"] == "platform")
    assert platform["waiting"] == 2 and platform["answered"] == 0
    deploy = next(row for row in stats["by_server"] if row["group"] == "deploy")
    assert deploy["answered"] == 5


def test_the_page_shows_the_chain_state_from_the_periodic_check(root: Client, seeded: Seeded) -> None:
    state = audit_tasks.verify_chain()
    assert state["ok"] and state["checked"] == len(seeded.ids)
    body = root.get(reverse("audit:index")).content.decode()
    assert 'data-chain-state="ok"' in body
    assert f"Chain intact: {len(seeded.ids)} events verified" in body


def test_the_page_says_when_the_chain_is_broken(root: Client, seeded: Seeded) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute(
            "UPDATE approvals_auditevent SET actor_label = 'mallory' WHERE id = %s",
            [seeded.ids["k8s.accepted"]],
        )
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    state = audit_tasks.verify_chain()
    assert not state["ok"] and state["first_bad_id"] == seeded.ids["k8s.accepted"]
    body = root.get(reverse("audit:index")).content.decode()
    assert f"Chain broken at event #{seeded.ids['k8s.accepted']}" in body


def test_staff_can_download_the_chain_head_others_cannot(client: Client, seeded: Seeded) -> None:
    client.force_login(factories.user("viewer"))
    assert client.get(reverse("audit:chain_head")).status_code == 403
    client.force_login(factories.user("staffer", is_staff=True))
    head = client.get(reverse("audit:chain_head")).json()
    last = AuditEvent.objects.order_by("-id").first()
    assert (head["head_id"], head["head_hash"]) == (last.id, last.hash)
