"""Reads compiled once (`approvals.prepared.PreparedRead`), on PostgreSQL: the same rows and related objects
as the queryset they come from, with each caller's values, and no SQL compilation after the first run."""

from __future__ import annotations

import threading
from typing import Any
from unittest import mock

import pytest
from django.db import connection, connections, transaction
from django.db.models.sql.compiler import SQLCompiler
from django.db.transaction import TransactionManagementError
from django.template.loader import render_to_string
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import selectors
from approvals.models import InputRequest, McpServer, Round, RoutingRule, ToolCall
from approvals.prepared import Many, PreparedRead, refresh
from tests import factories

pytestmark = pytest.mark.django_db

CARD_RELATED = (
    "round__call__server",
    "round__call__agent",
    "round__call__on_behalf_of",
    "answered_by",
    "team",
)


def _card_queryset(round_id: Any) -> Any:
    return (
        InputRequest.objects.select_related(*CARD_RELATED)
        .defer("round__request_state", "round__raw", "round__call__server__headers")
        .filter(round_id=round_id)
        .order_by("created_at", "key")
    )


def _card_read() -> PreparedRead[InputRequest]:
    return PreparedRead(_card_queryset, round_id=InputRequest._meta.get_field("round"))


def _two_rounds() -> tuple[Any, Any]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    server = factories.server("deploy", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[server])
    first = factories.open_round(factories.call(server, agent), keys=("environment", "region"), team_=release)
    second = factories.open_round(factories.call(server, agent, tool="rollback"), keys=("reason",))
    return first, second


def _shape(ir: InputRequest) -> tuple[Any, ...]:
    call = ir.round.call
    return (
        ir.pk,
        ir.key,
        ir.status,
        ir.requested_schema,
        ir.team.slug if ir.team else None,
        ir.round.number,
        call.pk,
        call.tool,
        call.arguments,
        call.server.slug,
        call.agent.name if call.agent else None,
        call.on_behalf_of,
    )


def test_a_prepared_read_gives_what_its_queryset_gives_for_each_value() -> None:
    first, second = _two_rounds()
    read = _card_read()
    for rnd in (first, second, first):
        expected = [_shape(ir) for ir in _card_queryset(rnd.pk)]
        got = read(round_id=rnd.pk)
        assert [_shape(ir) for ir in got] == expected
        assert {ir.round_id for ir in got} == {rnd.pk}
    assert [ir.key for ir in read(round_id=first.pk)] == ["environment", "region"]
    assert read(round_id=first.pk + second.pk + 1000) == []


def test_related_objects_come_with_the_row_and_deferred_fields_stay_deferred() -> None:
    first, _ = _two_rounds()
    read = _card_read()
    read(round_id=first.pk)  # compiled
    with CaptureQueriesContext(connection) as queries:
        [ir, _] = read(round_id=first.pk)
        assert ir.round.call.server.slug == "deploy"
        assert ir.team is not None and ir.team.slug == "release"
    assert len(queries) == 1
    assert "request_state" in ir.round.get_deferred_fields()
    assert ir.round.request_state == "opaque-state"  # loaded on demand, as Django does


def test_after_the_first_run_nothing_is_compiled_again() -> None:
    first, second = _two_rounds()
    read = _card_read()
    read(round_id=first.pk)
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        assert [ir.key for ir in read(round_id=second.pk)] == ["reason"]
        assert len(read(round_id=first.pk)) == 2
    # The plain queryset compiles every time: the patch above would have failed it.
    with (
        mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled")),
        pytest.raises(AssertionError),
    ):
        list(_card_queryset(first.pk))


def test_values_are_converted_as_their_field_converts_them() -> None:
    first, _ = _two_rounds()
    call = first.call
    read = PreparedRead(
        lambda pk: ToolCall.objects.select_related("server").filter(pk=pk), pk=ToolCall._meta.get_field("id")
    )
    for given in (call.pk, str(call.pk), call):
        [got] = read(pk=given)
        assert got.pk == call.pk and got.server.slug == "deploy"
    by_server = PreparedRead(
        lambda server: ToolCall.objects.filter(server=server).order_by("created_at"),
        server=ToolCall._meta.get_field("server"),
    )
    assert [c.tool for c in by_server(server=McpServer.objects.get(slug="deploy"))] == [
        "create_deployment",
        "rollback",
    ]


def test_each_thread_runs_it_on_its_own_connection() -> None:
    first, _ = _two_rounds()
    read = _card_read()
    read(round_id=first.pk)  # compiled on this thread
    seen: dict[str, Any] = {}

    def other() -> None:
        try:
            # The test's rows are in its open transaction: another connection does not see them. The read
            # must use this thread's connection (and so find nothing), not the compiling thread's.
            seen["rows"] = read(round_id=first.pk)
            seen["connection"] = connections["default"].connection
        finally:
            connections.close_all()

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert seen["rows"] == []
    assert seen["connection"] is not connection.connection


def test_reads_that_cannot_be_prepared_are_refused() -> None:
    field = InputRequest._meta.get_field("round")
    with pytest.raises(TypeError, match="parameters"):
        PreparedRead(lambda round_id: InputRequest.objects.filter(round_id__isnull=False), round_id=field)(
            round_id=1
        )
    with pytest.raises(ValueError, match="None"):
        _card_read()(round_id=None)
    with pytest.raises(TypeError, match="expected values"):
        _card_read()(round=1)


def test_the_queue_card_is_read_prepared() -> None:
    first, _ = _two_rounds()
    ids = [str(pk) for pk in InputRequest.objects.filter(round=first).values_list("pk", flat=True)]
    card = selectors.round_card_for_everyone(ids, round_id=first.pk)
    assert card is not None
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        again = selectors.round_card_for_everyone(ids, round_id=first.pk)
    assert again is not None and again.round_id == first.pk
    assert [ir.key for ir in again.items] == ["environment", "region"]
    assert again.call.server.slug == "deploy"


def test_a_queue_card_renders_from_its_one_read() -> None:
    """The card is read once per queue event and rendered for every socket: nothing it shows is left to a
    lazy read, and the server's stored JSON (its tool list above all) is not loaded for it."""
    first, _ = _two_rounds()
    McpServer.objects.filter(slug="deploy").update(tools=[{"name": "create_deployment", "inputSchema": {}}])
    InputRequest.objects.filter(round=first, key="region").update(
        status=InputRequest.Status.ANSWERED,
        action=InputRequest.Action.DECLINE,
        answered_by=factories.user("bob"),
        reason="not today",
        answered_at=timezone.now(),
    )
    with CaptureQueriesContext(connection) as queries:
        card = selectors.round_card_for_everyone([], round_id=first.pk)
        assert card is not None
        html = render_to_string("approvals/_round_card.html", {"card": card, "viewers": {}, "me": "alice"})
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert "Deploy server" in html and "create_deployment" in html
    assert "Declined by" in html and "not today" in html
    assert {"tools", "probe", "headers", "discover"} <= card.call.server.get_deferred_fields()


def test_a_read_without_values_and_a_locking_read() -> None:
    factories.team("release")
    rules = PreparedRead(lambda: RoutingRule.objects.filter(gate=False).select_related("team"))
    assert rules() == []
    RoutingRule.objects.create(name="all", position=1, team=factories.team("release"))
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        assert [rule.team.slug for rule in rules()] == ["release"]  # each run reads the table again
    locked = PreparedRead(
        lambda pk: ToolCall.objects.select_for_update(no_key=True).filter(pk=pk),
        pk=ToolCall._meta.get_field("id"),
    )
    call = factories.call(factories.server("deploy"))
    with transaction.atomic():
        assert [c.pk for c in locked(pk=call.pk)] == [call.pk]
    # Outside a transaction (the test runs inside one: the connection is made to say it is not).
    with (
        mock.patch.object(connections["default"], "get_autocommit", return_value=True),
        pytest.raises(TransactionManagementError),
    ):
        locked(pk=call.pk)


def test_rows_of_values_and_prefetched_relations_come_as_the_queryset_gives_them() -> None:
    first, second = _two_rounds()
    statuses = PreparedRead(
        lambda pk: ToolCall.objects.filter(pk=pk).values_list("status", "server__slug"),
        pk=ToolCall._meta.get_field("id"),
    )
    statuses(pk=first.call_id)
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        assert statuses(pk=first.call_id) == [("awaiting_input", "deploy")]
        assert statuses(pk=second.call_id) == [("awaiting_input", "deploy")]
    keys = PreparedRead(
        lambda call: (
            InputRequest.objects.filter(round__call=call).order_by("key").values_list("key", flat=True)
        ),
        call=Round._meta.get_field("call"),
    )
    assert keys(call=first.call_id) == ["environment", "region"]
    with_rounds = PreparedRead(
        lambda pk: ToolCall.objects.filter(pk=pk).prefetch_related("rounds__input_requests"),
        pk=ToolCall._meta.get_field("id"),
    )
    [call] = with_rounds(pk=first.call_id)
    with CaptureQueriesContext(connection) as queries:
        assert sorted(ir.key for rnd in call.rounds.all() for ir in rnd.input_requests.all()) == [
            "environment",
            "region",
        ]
    assert len(queries) == 0  # prefetched with the call


def test_the_any_lookup_matches_what_in_matches_with_one_statement_for_every_length() -> None:
    first, second = _two_rounds()
    third = factories.open_round(factories.call(first.call.server, tool="restart"), keys=("why",))
    rounds = [first.pk, second.pk, third.pk]
    read = PreparedRead(
        lambda rounds: InputRequest.objects.filter(round__any=rounds).order_by("key"),
        rounds=Many(InputRequest._meta.get_field("round")),
    )
    for chosen in ([], [second.pk], [first.pk, third.pk], rounds, [*rounds, 10**9]):
        expected = list(
            InputRequest.objects.filter(round__in=chosen).order_by("key").values_list("key", flat=True)
        )
        plain = list(
            InputRequest.objects.filter(round__any=chosen).order_by("key").values_list("key", flat=True)
        )
        assert plain == expected
        if chosen:
            continue
        assert read(rounds=chosen) == []  # the first run compiles
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        assert [ir.key for ir in read(rounds=[second.pk])] == ["reason"]
        assert [ir.key for ir in read(rounds=[str(first.pk), third])] == ["environment", "region", "why"]
        assert [ir.key for ir in read(rounds=[])] == []


def test_the_any_lookup_refuses_what_is_not_a_list_of_values() -> None:
    with pytest.raises(TypeError, match="list"):
        InputRequest.objects.filter(round__any=7)
    with pytest.raises(TypeError, match="list"):
        InputRequest.objects.filter(round__any="7")
    with pytest.raises(ValueError, match="None"):
        InputRequest.objects.filter(round__any=[1, None])
    read = PreparedRead(
        lambda rounds: InputRequest.objects.filter(round__any=rounds),
        rounds=Many(InputRequest._meta.get_field("round")),
    )
    with pytest.raises(TypeError, match="list"):
        read(rounds=7)
    with pytest.raises(ValueError, match="None"):
        read(rounds=[1, None])


def test_a_datetime_is_a_value_a_prepared_read_binds() -> None:
    _, second = _two_rounds()
    second.input_requests.update(created_at=timezone.now() + timezone.timedelta(hours=1))
    read = PreparedRead(
        lambda at: InputRequest.objects.filter(created_at__gt=at).order_by("key"),
        at=InputRequest._meta.get_field("created_at"),
    )
    middle = timezone.now() + timezone.timedelta(minutes=30)
    assert [ir.key for ir in read(at=middle)] == ["reason"]
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        assert len(read(at=middle - timezone.timedelta(hours=2))) == 3


def test_an_agents_call_with_its_rounds_is_read_prepared_and_as_the_prefetch_gives_it() -> None:
    """The agent's read of its own call (every GET and the end of every long-poll): the call, then its gates,
    rounds and their input requests, each statement compiled once; the body is the prefetched call's."""
    from approvals.api import endpoints

    first, second = _two_rounds()
    call = first.call
    Round.objects.filter(pk=first.pk).update(status="closed", closed_at=timezone.now())
    factories.open_round(call, number=2, keys=("confirm",))  # a second round of the same call
    expected = selectors.call_detail(selectors.calls_with_rounds().get(pk=call.pk))
    assert [len(rnd["input_requests"]) for rnd in expected["rounds"]] == [2, 1]
    assert selectors.call_detail(endpoints._own_call(call.agent, call.pk, call.kind)) == expected
    other = second.call
    expected_other = selectors.call_detail(selectors.calls_with_rounds().get(pk=other.pk))
    with (
        CaptureQueriesContext(connection) as queries,
        mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")),
    ):
        got = endpoints._own_call(call.agent, call.pk, call.kind)
        assert selectors.call_detail(got) == expected
        assert got.rounds.all()[1].input_requests.all()[0].round.call is got  # no query to walk back up
        assert selectors.call_detail(endpoints._own_call(other.agent, other.pk, other.kind)) == expected_other
    # Three statements a call: the call, its rounds, their requests. A call without a gate round has no gate
    # to read (tests.test_gates reads one that has).
    assert len(queries) == 6
    queued = factories.call(call.server, call.agent)
    with CaptureQueriesContext(connection) as queries:
        body = selectors.call_detail(endpoints._own_call(queued.agent, queued.pk, queued.kind))
    assert body == selectors.call_detail(selectors.calls_with_rounds().get(pk=queued.pk))
    assert body["rounds"] == []
    assert len(queries) == 2  # the call and its rounds: no rounds, no requests to read


def test_refresh_sets_what_refresh_from_db_sets_without_compiling_again() -> None:
    first, second = _two_rounds()
    call, other = first.call, second.call
    fields = ["status", "result", "attempts", "server"]
    for target in (call, other):
        ToolCall.objects.filter(pk=target.pk).update(status="completed", result={"n": [1, 2]}, attempts=3)
    refresh(call, fields)  # the first run compiles
    assert (call.status, call.result, call.attempts) == ("completed", {"n": [1, 2]}, 3)
    elsewhere = factories.server("elsewhere")
    ToolCall.objects.filter(pk=other.pk).update(server=elsewhere)
    assert other.server.slug == "deploy"  # cached with the instance
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        refresh(other, fields)
    plain = ToolCall.objects.get(pk=other.pk)
    assert (other.status, other.result, other.attempts, other.server_id) == (
        plain.status,
        plain.result,
        plain.attempts,
        plain.server_id,
    )
    assert other.server.slug == "elsewhere"  # the changed key's cached server was dropped
    ToolCall.objects.filter(pk=other.pk).delete()
    with pytest.raises(ToolCall.DoesNotExist):
        refresh(other, fields)


def test_a_round_opened_between_the_reads_of_a_call_waits_for_the_next_read() -> None:
    """The call's rounds and their requests are two statements: a round opened in between has requests the
    first did not see. They are left out (the next read shows them), not a failure."""
    first, _ = _two_rounds()
    call = first.call
    Round.objects.filter(pk=first.pk).update(status="closed", closed_at=timezone.now())
    factories.open_round(call, number=2, keys=("confirm",))
    rounds_read = selectors._CALL_ROUNDS

    def before_the_second_round(**values: Any) -> list[Round]:
        return [rnd for rnd in rounds_read(**values) if rnd.number == 1]

    with mock.patch.object(selectors, "_CALL_ROUNDS", before_the_second_round):
        body = selectors.call_detail(selectors.with_rounds(selectors.call_alone().get(pk=call.pk)))
    assert [[ir["key"] for ir in rnd["input_requests"]] for rnd in body["rounds"]] == [
        ["environment", "region"]
    ]
