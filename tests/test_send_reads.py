"""What one send reads: the send path (`sending.call_send`) against a real MCP server over HTTP, with the
statements it runs captured. Every send passes through it twice per round (the first tools/call, then the
retry), so a read repeated here is paid by every call the hub makes.
"""

from __future__ import annotations

import re
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext

from approvals.models import AuditEvent, McpServer, ToolCall
from approvals.services import answers, calls, rounds, sending, servers
from tests import factories
from tests.test_mcp_client import LiveServer

pytestmark = pytest.mark.django_db


def greeting_call(mcp: LiveServer) -> tuple[Any, ToolCall]:
    """A reviewer of the server's team, and a call of the test server's ``ask_name`` (one round), on a server
    whose tools are listed and stored."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    server = McpServer.objects.create(
        slug="greeter", name="Greeter", url=f"{mcp.base}/mcp", default_team=release
    )
    servers.server_refresh_tools(server=server)  # its stored tool list, as a registered server has
    agent, _ = factories.agent("ci-bot", servers=[server])
    return alice, factories.call(server, agent, tool="ask_name", arguments={"greeting": "Hello"})


def _selects(queries: list[dict[str, Any]], table: str) -> list[str]:
    """The SELECT statements that read `table` as their own row source (not through a join)."""
    return [q["sql"] for q in queries if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"]]


def test_a_send_and_an_answer_read_each_row_once_and_never_reload_it(mcp_test_server: LiveServer) -> None:
    alice, call = greeting_call(mcp_test_server)

    with CaptureQueriesContext(connection) as first:
        sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    ir = call.rounds.get().input_requests.get()

    with CaptureQueriesContext(connection) as answer:
        answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})
    # The answer reads the request once (with its round, call, server and team) and never again after its
    # UPDATE; no team row is read on its own for the audit events or the queue's notice.
    # (Besides whether any of the round's requests is still pending: an existence check, the id alone.)
    requests = [
        sql
        for sql in _selects(answer.captured_queries, "approvals_inputrequest")
        if not sql.startswith(("SELECT 1", 'SELECT "approvals_inputrequest"."id" AS "pk" FROM'))
    ]
    assert len(requests) == 1, requests
    # Nor does it read the stored JSON it never uses: the server's answer and secret state, the server's
    # credentials and tool list, the call's result.
    reads = [q["sql"] for q in answer.captured_queries if q["sql"].startswith("SELECT")]
    for column in (
        '"approvals_round"."raw"',
        '"approvals_round"."request_state"',
        '"approvals_mcpserver"."headers"',
        '"approvals_mcpserver"."tools"',
        '"approvals_toolcall"."result"',
    ):
        assert not [sql for sql in reads if column in sql], column
    # The only read of teams on their own: which teams the reviewer belongs to (the permission check).
    teams = _selects(answer.captured_queries, "approvals_team")
    assert [sql.split(" FROM ")[0] for sql in teams] == ['SELECT "approvals_team"."id" AS "pk"'], teams

    with CaptureQueriesContext(connection) as retry:
        sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED
    assert call.result["content"][0]["text"].startswith("Hello, Ada!")

    # The audit chain's appends join the step's transaction: no savepoint of their own (the test's own
    # transaction turns every transaction of the code into a savepoint; the audit's would come just before
    # the chain lock). Each is two statements: the lock with the ids and the head's hash, then the INSERT.
    for queries in (first.captured_queries, answer.captured_queries, retry.captured_queries):
        sqls = [q["sql"] for q in queries]
        locks = [i for i, sql in enumerate(sqls) if "approvals_audit_reserve" in sql]
        assert locks, sqls
        assert not [i for i in locks if sqls[i - 1].startswith("SAVEPOINT")], sqls
        assert all(sqls[i + 1].startswith('INSERT INTO "approvals_auditevent"') for i in locks), sqls

    # The finish sets on the call what it wrote: the result is not read back (nor decoded again).
    finished = [
        sql
        for sql in _selects(retry.captured_queries, "approvals_toolcall")
        if sql.startswith('SELECT "approvals_toolcall"."status"') and '"approvals_toolcall"."result"' in sql
    ]
    assert finished == [], finished

    # A claim sets on the call (the round) what its UPDATE wrote: nothing claimed is read back.
    for queries, claim, table in (
        (
            first.captured_queries,
            'UPDATE "approvals_toolcall" SET "status" = \'running\'',
            "approvals_toolcall",
        ),
        (retry.captured_queries, 'UPDATE "approvals_round" SET "status" = \'sending\'', "approvals_round"),
    ):
        sqls = [q["sql"] for q in queries]
        at = next(i for i, sql in enumerate(sqls) if sql.startswith(claim))
        assert not sqls[at + 1].startswith("SELECT") or f'FROM "{table}"' not in sqls[at + 1], sqls[at + 1]

    # After letting go of the call's lock, a send looks once for a round answered meanwhile; not once the
    # call has ended.
    for queries, looks in ((first.captured_queries, 1), (retry.captured_queries, 0)):
        sqls = [q["sql"] for q in queries]
        unlock = next(i for i, sql in enumerate(sqls) if sql.startswith("SELECT pg_advisory_unlock"))
        assert len(sqls[unlock + 1 :]) == looks, sqls[unlock + 1 :]

    # The round's number: the last one is read once, for the limit on rounds and the new round's number, in
    # the statement that marks the call as awaiting input.
    numbers = [q["sql"] for q in first.captured_queries if "max(r.number)" in q["sql"]]
    assert len(numbers) == 1, numbers
    assert not [q for q in first.captured_queries if q["sql"].startswith('SELECT "approvals_round"."number"')]
    # The round just opened is not read back: the send knows whether a person must answer it.
    statuses = [q for q in first.captured_queries if q["sql"].startswith('SELECT "approvals_round"."status"')]
    assert statuses == [], statuses

    for queries in (first.captured_queries, retry.captured_queries):
        # The server (and its default team, which the audit events name) come with the call, in its join:
        # never read again on their own after a refresh, per audit event.
        assert _selects(queries, "approvals_mcpserver") == []
        # Where the send happens (one narrow read), the claim (the row with its server), the lock before the
        # answer is applied; the refreshes after the claim and the finish read only what they wrote.
        calls = _selects(queries, "approvals_toolcall")
        assert len(calls) <= 4, "\n".join(calls)
        assert all('"approvals_toolcall"."arguments"' not in sql for sql in calls[2:]), calls[2:]
    assert not [
        q for q in first.captured_queries + retry.captured_queries if 'FROM "approvals_team"' in q["sql"]
    ]


def test_a_send_compiles_none_of_its_reads_of_the_call_its_rounds_and_gates(
    mcp_test_server: LiveServer,
) -> None:
    """After a first send in this process, the next call's send (its claim, the gate check, the answer's
    record, the new round's status) compiles no SELECT of a call, round or gate: each is a prepared read."""
    _, warm = greeting_call(mcp_test_server)
    sending.call_send(call_id=warm.pk)
    call = factories.call(warm.server, warm.agent, tool="ask_name", arguments={"greeting": "Hi"})
    compiled: list[str] = []
    as_sql = SQLCompiler.as_sql

    def recording(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        sql, params = as_sql(self, *args, **kwargs)
        compiled.append(sql)
        return sql, params

    with mock.patch.object(SQLCompiler, "as_sql", recording):
        sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    tables = ("approvals_toolcall", "approvals_round", "approvals_gate")
    again = [
        sql for sql in compiled if sql.startswith("SELECT") and any(f'FROM "{t}"' in sql for t in tables)
    ]
    assert again == [], "\n".join(again)


def _compiled_selects(run: Any) -> list[str]:
    compiled: list[str] = []
    as_sql = SQLCompiler.as_sql

    def recording(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        sql, params = as_sql(self, *args, **kwargs)
        if sql.startswith("SELECT"):
            compiled.append(sql)
        return sql, params

    with mock.patch.object(SQLCompiler, "as_sql", recording):
        run()
    return compiled


def test_a_submit_and_an_answer_compile_no_read_after_the_first(mcp_test_server: LiveServer) -> None:
    """The agent's submit and the reviewer's answer, each one per call, read only through statements compiled
    once per process (after a first call has compiled them)."""
    alice, warm = greeting_call(mcp_test_server)

    def one_call() -> tuple[Any, Any]:
        call, _ = calls.call_submit(
            agent=warm.agent, server_slug="greeter", tool="ask_name", arguments={"greeting": "Hi"}
        )
        sending.call_send(call_id=call.pk)
        return call, call.rounds.get().input_requests.get()

    def answer(ir: Any) -> None:
        answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})

    _, ir = one_call()
    answer(ir)
    submitted: list[Any] = []
    assert (
        _compiled_selects(
            lambda: submitted.append(
                calls.call_submit(
                    agent=warm.agent, server_slug="greeter", tool="ask_name", arguments={"greeting": "Hey"}
                )
            )
        )
        == []
    )
    sending.call_send(call_id=submitted[0][0].pk)
    ir = submitted[0][0].rounds.get().input_requests.get()
    assert _compiled_selects(lambda: answer(ir)) == []
    ir.refresh_from_db()
    assert ir.status == "answered"


def test_past_the_limit_on_rounds_the_call_fails_and_opens_no_round(
    mcp_test_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, call = greeting_call(mcp_test_server)
    ToolCall.objects.filter(pk=call.pk).update(tool="two_rounds", arguments={})
    monkeypatch.setattr(sending, "MAX_ROUNDS", 1)

    sending.call_send(call_id=call.pk)  # the server's first question: round 1, within the limit
    first = call.rounds.get()
    assert first.number == 1
    ir = first.input_requests.get()
    answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})

    sending.call_send(call_id=call.pk)  # the retry: the server asks again, past the limit
    call.refresh_from_db()
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "too_many_rounds"
    assert list(call.rounds.values_list("number", flat=True)) == [1]


def _applied(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The statements of each `sending._apply` (a server's answer recorded) from now on, savepoints aside."""
    runs: list[list[str]] = []
    apply = sending._apply

    def capturing(*args: Any, **kwargs: Any) -> bool:
        with CaptureQueriesContext(connection) as queries:
            due = apply(*args, **kwargs)
        runs.append(
            [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
        )
        return due

    monkeypatch.setattr(sending, "_apply", capturing)
    return runs


def test_a_servers_question_is_recorded_with_one_statement_on_the_call(
    mcp_test_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call's lock, its last round's number and its new status (`awaiting_input`) are one UPDATE; then the
    routing rules, the round, its request and the audit chain's two (its lock with the ids and the head's
    hash, then the events). Six statements, where there were nine: each is a round trip while the call's new
    round waits to be seen."""
    _, call = greeting_call(mcp_test_server)
    runs = _applied(monkeypatch)
    sending.call_send(call_id=call.pk)

    assert len(runs) == 1
    statements = runs[0]
    on_call = [sql for sql in statements if "approvals_toolcall" in sql]
    assert len(on_call) == 1, on_call
    assert on_call[0].startswith("UPDATE approvals_toolcall"), on_call
    assert "approvals_round" in on_call[0]  # the last round's number, in the same statement
    kinds = [sql.split(" ")[0] for sql in statements]
    assert kinds == ["UPDATE", "SELECT", "INSERT", "INSERT", "SELECT", "INSERT"], "\n".join(statements)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    assert list(call.rounds.values_list("number", "status")) == [(1, "open")]


def test_a_new_rounds_announcement_after_the_commit_writes_nothing(
    mcp_test_server: LiveServer, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    """After the commit a new round's card is read and rendered and the queues are told. It also wrote the
    time of that moment on the round, a statement per round that only a benchmark read."""
    _, call = greeting_call(mcp_test_server)
    statements: list[str] = []
    announce = rounds._announce

    def capturing(*args: Any) -> None:
        with CaptureQueriesContext(connection) as queries:
            announce(*args)
        statements.extend(q["sql"] for q in queries)

    monkeypatch.setattr(rounds, "_announce", capturing)
    with django_capture_on_commit_callbacks(execute=True):
        sending.call_send(call_id=call.pk)

    assert statements, "the announcement ran"
    assert [sql for sql in statements if not sql.startswith("SELECT")] == []


def test_the_dropped_visible_at_column_stays_for_a_previous_release_writing_it(
    mcp_test_server: LiveServer,
) -> None:
    """The model no longer has `Round.visible_at`; its column stays for one release, nullable, so a worker of
    the previous release still running in a rolling deploy can write it after a round's commit."""
    _, call = greeting_call(mcp_test_server)
    sending.call_send(call_id=call.pk)
    rnd = call.rounds.get()
    with connection.cursor() as cursor:
        cursor.execute('UPDATE "approvals_round" SET "visible_at" = now() WHERE "id" = %s', [rnd.pk])
        assert cursor.rowcount == 1
    assert "visible_at" not in {field.name for field in type(rnd)._meta.get_fields()}


def test_a_servers_result_is_recorded_with_one_statement_on_the_call(
    mcp_test_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the retry the call's lock and its end (`completed`, with the result) are one UPDATE, conditional on
    the send being on its way; no locking read of the call before it."""
    alice, call = greeting_call(mcp_test_server)
    sending.call_send(call_id=call.pk)
    ir = call.rounds.get().input_requests.get()
    answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})
    runs = _applied(monkeypatch)
    sending.call_send(call_id=call.pk)

    assert len(runs) == 1
    on_call = [sql for sql in runs[0] if '"approvals_toolcall"' in sql]
    assert len(on_call) == 1, on_call
    assert on_call[0].startswith('UPDATE "approvals_toolcall" SET "status" = \'completed\''), on_call
    assert "FOR NO KEY UPDATE" not in "\n".join(runs[0])
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED
    assert list(call.rounds.values_list("status", flat=True)) == ["closed"]


def _cancel_before_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent cancels while the send is on its way: just before the server's answer is applied."""
    apply = sending._apply

    def cancelled_first(send: Any, outcome: Any, *, received_at: Any) -> bool:
        ToolCall.objects.filter(pk=send.call.pk).update(status=ToolCall.Status.CANCELLED)
        return apply(send, outcome, received_at=received_at)

    monkeypatch.setattr(sending, "_apply", cancelled_first)


def test_a_question_for_a_call_cancelled_meanwhile_opens_no_round(
    mcp_test_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's question is recorded as discarded, the call stays cancelled and nobody is asked."""
    _, call = greeting_call(mcp_test_server)
    _cancel_before_apply(monkeypatch)
    sending.call_send(call_id=call.pk)

    call.refresh_from_db()
    assert call.status == ToolCall.Status.CANCELLED
    assert not call.rounds.exists()
    discarded = AuditEvent.objects.get(call_id=call.pk, verb="call.outcome_discarded")
    assert discarded.data == {"reason": "the call was cancelled meanwhile"}


def test_a_result_for_a_call_cancelled_meanwhile_is_not_stored(
    mcp_test_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry's result comes after the agent cancelled: recorded as discarded, the call stays cancelled
    with no result, and its round is left as the cancel left it."""
    alice, call = greeting_call(mcp_test_server)
    sending.call_send(call_id=call.pk)
    ir = call.rounds.get().input_requests.get()
    answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})
    _cancel_before_apply(monkeypatch)
    sending.call_send(call_id=call.pk)

    call.refresh_from_db()
    assert call.status == ToolCall.Status.CANCELLED
    assert call.result is None
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="call.completed").exists()
    assert list(call.rounds.values_list("status", flat=True)) == ["sending"]
    discarded = AuditEvent.objects.get(call_id=call.pk, verb="call.outcome_discarded")
    assert discarded.data == {"reason": "the call was cancelled meanwhile"}


_WHOLE_COLUMN = r'"approvals_mcpserver"\."{}"(,| FROM)'


def test_a_send_leaves_the_servers_probe_and_stdio_settings_unread(mcp_test_server: LiveServer) -> None:
    """The claim reads the call with its server. The server's probe, and the `args` and `env` only a stdio
    server's holder uses, are not selected (nor decoded) on the way to a send. The tool list is read: the send
    passes the tool's stored definition."""
    alice, call = greeting_call(mcp_test_server)
    McpServer.objects.filter(pk=call.server_id).update(probe={"ok": True, "era": "2026-07-28", "tools": []})
    with CaptureQueriesContext(connection) as first:
        sending.call_send(call_id=call.pk)
    ir = call.rounds.get().input_requests.get()
    answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})
    with CaptureQueriesContext(connection) as retry:
        sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED

    for queries in (first.captured_queries, retry.captured_queries):
        reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
        claims = [sql for sql in reads if re.search(_WHOLE_COLUMN.format("url"), sql)]
        assert claims, reads  # the claim's read of the call with its server
        for column in ("probe", "args", "env"):
            assert not [sql for sql in reads if re.search(_WHOLE_COLUMN.format(column), sql)], column
        assert [sql for sql in claims if re.search(_WHOLE_COLUMN.format("tools"), sql)]
