"""What one inbox answer reads, on PostgreSQL: the reviewer's teams once (for the queues' version and for
the page alike), then the page, whose statement is compiled once per shape."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import selectors
from approvals.models import InputRequest, Round, ToolCall
from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db


def _reads_of_teams(queries: CaptureQueriesContext) -> list[str]:
    """The statements that read teams or memberships as their own rows, but for the token's (which brings
    the teams along)."""
    return [
        q["sql"]
        for q in queries
        if ('FROM "approvals_team"' in q["sql"] or 'FROM "approvals_membership"' in q["sql"])
        and 'FROM "approvals_personaltoken"' not in q["sql"]
    ]


def test_an_inbox_answer_reads_the_reviewers_teams_with_their_token() -> None:
    rita = factories.user("rita")
    release = factories.team("release", (rita, "reviewer"))
    ops = factories.team("ops")
    factories.team("viewers", (rita, "viewer"))  # a team she sees but does not answer for
    server = factories.server("deploy", default_team=release)
    factories.open_round(factories.call(server), team_=release)
    factories.open_round(factories.call(server, tool="rollback"), keys=("reason",), team_=ops)
    _, token = tokens.personal_token_create(user=rita)
    with CaptureQueriesContext(connection) as queries:
        response = Client().get("/api/v1/inbox", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert [item["key"] for item in response.json()] == ["environment"]  # ops' request is not hers
    # Her teams came with the token's statement (once, for the queues' version and for the page alike).
    assert _reads_of_teams(queries) == []
    tokens_read = [q["sql"] for q in queries if 'FROM "approvals_personaltoken"' in q["sql"]]
    assert len(tokens_read) == 1 and '"approvals_membership"' in tokens_read[0], tokens_read


def test_an_answer_reads_the_reviewers_teams_with_their_token() -> None:
    rita = factories.user("rita")
    release = factories.team("release", (rita, "reviewer"))
    server = factories.server("deploy", default_team=release)
    rnd = factories.open_round(factories.call(server), team_=release)
    ir = rnd.input_requests.get()
    _, token = tokens.personal_token_create(user=rita)
    with CaptureQueriesContext(connection) as queries:
        response = Client().post(
            f"/api/v1/input-requests/{ir.pk}/respond",
            {"action": "accept", "content": {"environment": "staging"}},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    assert response.status_code == 200, response.content
    assert _reads_of_teams(queries) == []


def test_an_answer_by_someone_not_on_the_team_is_still_refused() -> None:
    rita, sam = factories.user("rita"), factories.user("sam")
    release = factories.team("release", (rita, "reviewer"))
    factories.team("ops", (sam, "reviewer"))
    factories.team("release-viewers", (sam, "viewer"))
    server = factories.server("deploy", default_team=release)
    ir = factories.open_round(factories.call(server), team_=release).input_requests.get()
    _, token = tokens.personal_token_create(user=sam)
    response = Client().post(
        f"/api/v1/input-requests/{ir.pk}/respond",
        {"action": "accept", "content": {"environment": "staging"}},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_a_reviewer"


def test_an_inbox_answer_leaves_the_servers_tool_list_and_configuration_unread() -> None:
    """Every item of every page carries its call's server: only its slug and name are shown, so the stored
    tool list, probe and configuration (the largest JSON the hub keeps) are not selected, and nothing an
    item shows is read lazily afterwards."""
    rita = factories.user("rita")
    release = factories.team("release", (rita, "reviewer"))
    tools = [{"name": f"tool-{n}", "inputSchema": {"type": "object"}} for n in range(50)]
    server = factories.server("deploy", default_team=release, tools=tools, probe={"tools": tools})
    for tool in ("a", "b", "c"):
        factories.open_round(factories.call(server, tool=tool), keys=(f"k-{tool}",), team_=release)
    _, token = tokens.personal_token_create(user=rita)
    client = Client()
    client.get("/api/v1/inbox", HTTP_AUTHORIZATION=f"Bearer {token}")  # the token check's first use
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/api/v1/inbox", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert [(item["key"], item["server"]) for item in response.json()] == [
        ("k-a", "deploy"),
        ("k-b", "deploy"),
        ("k-c", "deploy"),
    ]
    server_reads = [q["sql"] for q in queries if 'FROM "approvals_mcpserver"' in q["sql"]]
    assert server_reads == []  # no lazy read of a deferred column
    page = [q["sql"] for q in queries if '"approvals_mcpserver"."slug"' in q["sql"]]
    assert len(page) == 1, page
    for column in ("tools", "probe", "discover", "headers", "env", "args", "tool_timeouts"):
        assert f'"approvals_mcpserver"."{column}"' not in page[0]


def test_inbox_pages_are_compiled_once_per_shape_whatever_the_teams() -> None:
    """The page's statement holds the reviewer's teams as one array: reviewers of one team and of three,
    staff and a superuser, first pages and pages after a cursor; after each shape's first read, nothing is
    compiled again, and each page is what the plain queryset gives."""
    rita, sam, boss = factories.user("rita"), factories.user("sam", is_staff=True), factories.user("boss")
    boss.is_superuser = True
    boss.save()
    release = factories.team("release", (rita, "reviewer"), (sam, "reviewer"))
    ops = factories.team("ops", (sam, "reviewer"))
    factories.team("db", (sam, "admin"))
    server = factories.server("deploy", default_team=release)
    for tool, team in (("a", release), ("b", ops), ("c", release), ("d", None)):
        factories.open_round(factories.call(server, tool=tool), keys=(f"k-{tool}",), team_=team)

    def pages(user: Any) -> list[list[str]]:
        got, cursor = [], None
        while True:
            page, cursor = selectors.inbox_page(user, limit=1, cursor=cursor)
            got.append([ir.key for ir in page])
            if cursor is None:
                return got

    def plain(user: Any) -> list[str]:
        return [ir.key for ir in selectors.inbox(user)]

    first = {user.username: pages(user) for user in (rita, sam, boss)}
    assert first["rita"] == [["k-a"], ["k-c"]]
    assert first["sam"] == [["k-a"], ["k-b"], ["k-c"], ["k-d"]]  # staff: the unrouted one too
    for user in (rita, sam, boss):
        assert [key for page in first[user.username] for key in page] == plain(user)
    new = factories.user("nina")
    factories.team("nina-team", (new, "reviewer"))
    ops.memberships.create(user=new, role="reviewer")
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        assert {user.username: pages(user) for user in (rita, sam, boss)} == first
        assert pages(new) == [["k-b"]]  # another list of teams, the same statement


def test_a_cursor_that_is_not_the_inboxs_is_refused() -> None:
    rita = factories.user("rita")
    for bad in ("!!", "e30", "WyJ4IiwieSIsInoiXQ", "WyIyMDI2LTAxLTAxVDAwOjAwOjAwIiwiYSIsIjEiXQ"):
        with pytest.raises(selectors.BadCursor):
            selectors.inbox_page(rita, limit=5, cursor=bad)


def test_the_inbox_page_is_planned_once_by_postgresql_not_at_every_read() -> None:
    """The page's statement is prepared on the connection (server-side binding) and, once PostgreSQL has
    compared plans, runs on its generic plan instead of being planned anew each time. With 'pending' sent
    as a parameter, the generic plan could not use the pending-requests index and was never chosen."""
    rita = factories.user("rita")
    release = factories.team("release", (rita, "reviewer"))
    server = factories.server("deploy", default_team=release)
    # A history of answered requests, as every running hub has: the pending ones are few among many.
    old = factories.open_round(factories.call(server, tool="old"), keys=())
    now = timezone.now()
    InputRequest.objects.bulk_create(
        InputRequest(
            round=old,
            key=f"k{i}",
            message="Pick",
            requested_schema=factories.ENVIRONMENT_SCHEMA,
            team=release,
            status="cancelled",
            action="cancel",
            answered_at=now,
        )
        for i in range(3000)
    )
    Round.objects.filter(pk=old.pk).update(status="closed", closed_at=now)
    factories.open_round(factories.call(server), team_=release)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE approvals_inputrequest")
        raw = cursor.connection
        raw.execute("DEALLOCATE ALL")
        for _ in range(15):
            page, _ = selectors.inbox_page(rita, limit=50)
            assert [ir.key for ir in page] == ["environment"]
        # The page's rows with what an item shows (the ten-table join, 3-6 ms to plan); the statement that
        # chooses the page reads one table and plans in a fraction of a millisecond.
        plans = raw.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ['%FROM "approvals_inputrequest"%JOIN "approvals_round"%'],
        ).fetchall()
    assert len(plans) == 1, plans
    generic, _ = plans[0]
    assert generic >= 1, plans


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _plan_nodes(child))]


def test_a_backlog_is_sorted_on_the_requests_alone_and_only_the_page_is_joined() -> None:
    """A queue with hundreds of pending requests: the page is chosen on the requests' own table, and only its
    rows are joined with the round, the call, its server, agent and teams. (One statement joined every
    pending request the reviewer may answer before sorting them and keeping the page: an inbox read cost
    in proportion to the backlog, 13 ms of PostgreSQL per read at 1,500 pending.)"""
    rita = factories.user("rita")
    release, ops = factories.team("release", (rita, "reviewer")), factories.team("ops")
    server = factories.server("deploy", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[server])
    calls = ToolCall.objects.bulk_create(
        ToolCall(agent=agent, server=server, tool="deploy", arguments={}, status="awaiting_input")
        for _ in range(400)
    )
    start = timezone.now() - timedelta(hours=1)
    deadline = timezone.now() + timedelta(hours=1)
    rounds = Round.objects.bulk_create(Round(call=call, number=1, deadline=deadline) for call in calls)
    InputRequest.objects.bulk_create(
        InputRequest(
            round=rnd,
            key="environment",
            message="Pick",
            requested_schema=factories.ENVIRONMENT_SCHEMA,
            team=release if i % 2 else ops,
            created_at=start + timedelta(seconds=i),
        )
        for i, rnd in enumerate(rounds)
    )
    hers = list(InputRequest.objects.filter(team=release).order_by("created_at").values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    with CaptureQueriesContext(connection) as queries:
        page, cursor_ = selectors.inbox_page(rita, limit=20)
    assert [ir.pk for ir in page] == hers[:20]
    assert [ir.pk for ir in selectors.inbox_page(rita, limit=20, cursor=cursor_)[0]] == hers[20:40]

    joined = [q["sql"] for q in queries if 'JOIN "approvals_round"' in q["sql"]]
    assert len(joined) == 1, joined
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + joined[0])
        plan = cursor.fetchone()[0][0]["Plan"]
    read = [
        node["Actual Rows"] * node["Actual Loops"]
        for node in _plan_nodes(plan)
        if node.get("Relation Name") == "approvals_inputrequest"
    ]
    assert read and sum(read) <= 20, read  # the page's rows, not the 200 pending ones that are hers


def test_only_a_plain_word_is_written_into_a_statement() -> None:
    from approvals.models import Written

    assert Written("pending").value == "pending"
    for hostile in ("", "Pending", "x' OR '1'='1", "a-b", "pend ing", 7):
        with pytest.raises(ValueError, match="constant"):
            Written(hostile)  # type: ignore[arg-type]
