"""A changelist reads its page in a fixed number of queries, however many rows it lists: a row does not read
its server, agent, team, policy, owner or member count on its own (a page of the calls' or the requests'
list is a hundred rows)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.audit import core as audit
from approvals.models import InputRequest, Policy, RoutingRule
from tests import factories

pytestmark = pytest.mark.django_db

LISTS = ["mcpserver", "team", "toolcall", "inputrequest", "routingrule", "policy", "agentclient"]


def queries(client: Client, model: str) -> int:
    with CaptureQueriesContext(connection) as seen:
        page = client.get(f"/admin/approvals/{model}/")
    assert page.status_code == 200
    return len(seen.captured_queries)


def add_rows(n: int, start: int) -> None:
    for i in range(start, start + n):
        team = factories.team(f"t{i}", (factories.user(f"reviewer{i}"), "reviewer"))
        server = factories.server(f"s{i}", default_team=team)
        agent, _ = factories.agent(f"agent{i}", owner=factories.user(f"owner{i}"))
        factories.open_round(factories.call(server, agent), team_=team)
        InputRequest.objects.filter(round__call__server=server).update(answered_by=factories.user(f"a{i}"))
        policy = Policy.objects.create(name=f"p{i}", escalation_team=team, escalate_after=60)
        RoutingRule.objects.create(name=f"r{i}", team=team, server=server, policy=policy)


@pytest.mark.parametrize("model", LISTS)
def test_a_changelist_reads_as_many_queries_for_many_rows_as_for_one(
    admin_client: Client, model: str
) -> None:
    add_rows(1, 0)
    one = queries(admin_client, model)
    add_rows(6, 1)

    assert queries(admin_client, model) == one


def test_the_team_list_counts_each_teams_members(admin_client: Client) -> None:
    factories.team("ops", (factories.user("a"), "reviewer"), (factories.user("b"), "admin"))
    factories.team("empty")
    page = admin_client.get("/admin/approvals/team/", {"o": "3"})  # by member count

    assert page.status_code == 200
    rows = page.text.split("<tr")
    ops = next(row for row in rows if ">ops<" in row)
    empty = next(row for row in rows if ">empty<" in row)
    assert 'field-member_count">2<' in ops and 'field-member_count">0<' in empty


def test_the_audit_log_list_offers_the_registered_verbs_without_reading_the_whole_log(
    admin_client: Client,
) -> None:
    audit.record(actor=audit.Actor.system(), verb="team.created", data={})
    audit.record(actor=audit.Actor.system(), verb="server.created", data={})

    with CaptureQueriesContext(connection) as seen:
        page = admin_client.get("/admin/approvals/auditevent/")
    assert page.status_code == 200
    assert "?verb=call.submitted" in page.text  # registered, though never written yet
    reads = [query["sql"] for query in seen.captured_queries if "approvals_auditevent" in query["sql"]]
    assert not any("DISTINCT" in sql for sql in reads)
    assert sum("COUNT(*)" in sql for sql in reads) == 1

    filtered = admin_client.get("/admin/approvals/auditevent/", {"verb": "team.created"})
    assert filtered.status_code == 200
    assert "team.created" in filtered.text and "server.created</td>" not in filtered.text
