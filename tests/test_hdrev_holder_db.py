"""The holder and its PostgreSQL connection: a connection that breaks (PostgreSQL restarted, a failover, an
idle connection cut by a proxy) must cost a retry, not the holder and every session it keeps open.

Real parts only: the push server (tests/push_server.py, ``ctx.elicit()`` over Streamable HTTP with sessions),
``manage.py run_holder`` in its own process on the test database, the agent and reviewer on the HTTP API.
The holder's connections are ended with ``pg_terminate_backend``, as a PostgreSQL restart ends them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals.holder.process import db
from approvals.models import Holder, McpServer, Round, ToolCall
from tests.hub import Hub, set_up_hub
from tests.live import HolderRunner, child_env, release_thread_connections, wait_until
from tests.test_session import PushServer

WAIT = 120  # the server waits long enough for the question to outlive the outage

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def push() -> Iterator[PushServer]:
    server = PushServer(wait=WAIT)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub(live_db: None, push: PushServer) -> Hub:
    hub = set_up_hub(push.url, slug="pushy", honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(era=McpServer.Era.HANDSHAKE, elicitation_wait=WAIT)
    hub.server.refresh_from_db()
    return hub


@pytest.fixture
def holder(live_db: None) -> Iterator[HolderRunner]:
    runner = HolderRunner(child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1")).start()
    try:
        yield runner
    finally:
        runner.stop()


def _cut_connections(runner: HolderRunner) -> int:
    """End every PostgreSQL session the holder process has open, as a PostgreSQL restart would."""
    assert runner.proc is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [f"elicit-hub pid {runner.proc.pid}"],
        )
        return int(cursor.fetchone()[0])


def _finished(hub: Hub, call_id: str, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(done, timeout, 0.1, what=f"call {call_id} to end")  # type: ignore[return-value]


def test_a_waiting_question_outlives_the_holders_lost_database_connection(
    hub: Hub, holder: HolderRunner
) -> None:
    call_id = hub.agent.call("ask", {"question": "Which branch?"}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    holder_row = Holder.objects.get()

    cut_at = timezone.now()
    assert _cut_connections(holder) >= 1
    # The holder notices (its next heartbeat, claim or read fails), takes a new connection and goes on: its
    # heartbeat is recorded again, and the process is still there.
    wait_until(
        lambda: Holder.objects.filter(pk=holder_row.pk, heartbeat_at__gt=cut_at).exists(),
        20,
        0.1,
        what="the holder's heartbeat after its connection was cut",
    )
    assert holder.proc is not None and holder.proc.poll() is None, holder.log()[-3000:]

    # The question still waits, and the reviewer's answer still reaches the server on the same session.
    assert Round.objects.get(call_id=uuid.UUID(call_id)).status == Round.Status.OPEN
    assert hub.reviewer.respond(item["id"], "accept", {"text": "release-8"}).status_code == 200
    call = _finished(hub, call_id)
    assert call["status"] == "completed", call
    assert call["result"]["content"][0]["text"] == "accepted: release-8"
    assert ToolCall.objects.get(pk=call_id).holder_id is None


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _backend_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])


async def _holder_backend_pid() -> int:
    """The PostgreSQL session of the holder's database thread (its `db` runs the query there)."""
    return await db(_backend_pid)()


def test_the_holders_first_query_after_postgresql_ended_its_session_works(live_db: None) -> None:
    """A result arriving just after a PostgreSQL restart is the first query on the holder's thread: it must
    get a working connection, not fail (and the result with it)."""
    try:
        first = asyncio.run(_holder_backend_pid())
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])
        wait_until(lambda: not _backend_alive(first), 10, 0.05, what="the holder's session to end")
        second = asyncio.run(_holder_backend_pid())
    finally:
        release_thread_connections()
    assert second != first


def _refuse_updates(when: str) -> Iterator[Any]:
    """PostgreSQL refuses the updates of a call matching `when`, as a database that is away does (SQLSTATE
    57P01, what a session ended by a restart reports), until the function given is called."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_hdrev_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'the database is away' USING ERRCODE = 'admin_shutdown'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_hdrev_refuse BEFORE UPDATE ON approvals_toolcall FOR EACH ROW "
            f"WHEN ({when}) EXECUTE FUNCTION test_hdrev_refuse()"
        )

    def back() -> None:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_hdrev_refuse ON approvals_toolcall")
            cursor.execute("DROP FUNCTION IF EXISTS test_hdrev_refuse()")

    try:
        yield back
    finally:
        back()


@pytest.fixture
def ends_refused() -> Iterator[Any]:
    """Any call's end (completed, failed) is refused."""
    yield from _refuse_updates(
        "NEW.status IN ('completed', 'failed') AND OLD.status IS DISTINCT FROM NEW.status"
    )


def test_a_result_that_arrives_while_the_database_is_away_is_recorded_once_it_is_back(
    hub: Hub, holder: HolderRunner, ends_refused: Any
) -> None:
    before = len(holder.log())
    call_id = hub.agent.call("echo", {"text": "kept"}, server="pushy")
    # The result came back from the server; recording it failed.
    wait_until(
        lambda: "OperationalError" in holder.log()[before:],
        20,
        0.1,
        what="the holder to meet the database away",
    )
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.RUNNING
    ends_refused()  # the database is back
    call = _finished(hub, call_id)
    assert call["status"] == "completed", call
    assert call["result"]["content"][0]["text"] == "echo: kept"
    assert ToolCall.objects.get(pk=call_id).holder_id is None
