"""Sending a call exactly once, against the real worker, PostgreSQL, Redis and the demo MCP server: what a
server claims about a tool, a worker that only looks at a call while its sender is away from PostgreSQL,
and a send lease that Redis lost mid-send."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from approvals import tasks
from approvals.models import AuditEvent, McpServer, Round, ToolCall
from approvals.services import leases, sending
from approvals.services.servers import server_refresh_tools
from tests import demo_support
from tests.hub import set_up_hub
from tests.live import wait_until
from tests.test_crash_safety import kill_once_the_tool_ran, recovered, retries_sent
from tests.test_oncerev_leases import lease_holder
from tests.test_oncerev_record import _deploy_and_hold_the_answer, _end_sessions_of

pytestmark = pytest.mark.timeout(180)


def _claim_read_only_and_destructive(server: McpServer, tool: str) -> None:
    """The server lists `tool` as read-only and destructive at once (what the routing rules read as not
    read-only: `rules.read_hints`)."""
    server_refresh_tools(server=server)
    server.refresh_from_db()
    tools = [dict(t) for t in server.tools or []]
    for listed in tools:
        if listed.get("name") == tool:
            listed["annotations"] = {"readOnlyHint": True, "destructiveHint": True, "idempotentHint": False}
    McpServer.objects.filter(pk=server.pk).update(tools=tools, tools_fetched_at=timezone.now())


def test_a_read_only_and_destructive_tool_is_not_sent_again_after_a_crash(worker, demo_server) -> None:
    """A worker killed after the server ran the tool, as it held the answer. The server says the tool is
    read-only and destructive: the hub's rules take that as not read-only, so the send is not safe to repeat.
    Before, `safe_to_resend` read ``readOnlyHint`` alone and sent the retry again: the tool ran twice."""
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)
    _claim_read_only_and_destructive(hub.server, "create_deployment")
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
    kill_once_the_tool_ran(hub, worker, demo_server.url, call_id)
    call = recovered(worker, call_id)
    assert call.status == ToolCall.Status.FAILED
    error = call.error or {}
    assert error["code"] == sending.OUTCOME_UNKNOWN
    assert error["tool_may_have_run"] is True
    assert len(retries_sent(demo_server.url)) == 1
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    assert not AuditEvent.objects.filter(call_id=call_id, verb="round.resent").exists()
    assert not sending.safe_to_resend(ToolCall.objects.select_related("server").get(pk=call_id))


def test_a_worker_looking_at_the_call_does_not_take_the_answer_from_its_sender(worker, demo_server) -> None:
    """The sender's PostgreSQL session is lost while the server runs the tool. When it comes back to write the
    answer, another process holds the call's lock only to look at it (a duplicate or redelivered task, which
    finds the sender's lease and lets go). Before, the sender took that for a take-over and dropped the
    answer it held: the call then ended ``outcome_unknown`` although the server had answered."""
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)
    call_id = _deploy_and_hold_the_answer(hub, demo_server.url)
    assert _end_sessions_of(worker.proc.pid) >= 1
    key = sending._lock_key(call_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s::bigint)", [key])
    try:
        # Looking: the lock is taken, the send is not claimed again, and the sender's lease is live.
        assert leases.held(call_id)
        time.sleep(7)  # the answer comes (held 4 s by the server); the sender tries to take the lock back
        rnd = Round.objects.get(call_id=uuid.UUID(call_id), number=1)
        assert (rnd.status, rnd.send_attempts) == (Round.Status.SENDING, 1)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s::bigint)", [key])

    def finished() -> bool:
        tasks.recover_stuck(grace_seconds=0)  # beat; it must not hand the call to another worker
        return ToolCall.objects.get(pk=call_id).is_final

    wait_until(finished, 60, 0.5, what="the call to finish")
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    assert len(retries_sent(demo_server.url)) == 1
    assert not leases.held(call_id)


def _raw(call_id: str) -> bytes | None:
    key = leases._key(call_id)
    return leases._client(key).get(key)


def test_a_lease_redis_lost_mid_send_is_written_again_by_its_live_holder() -> None:
    """Redis restarted, flushed or evicted the key while its holder still sends: the holder's renewals write
    it again, so the others still see a live sender. Before, the lease stayed gone until the send ended."""
    call_id = str(uuid.uuid4())
    proc = lease_holder(call_id)
    try:
        token = _raw(call_id)
        assert token
        key = leases._key(call_id)
        assert leases._client(key).delete(key) == 1  # lost by Redis
        assert not leases.held(call_id)
        wait_until(lambda: _raw(call_id) == token, 5, 0.1, what="the lease to be written again")
        assert leases.held(call_id)
    finally:
        proc.kill()
        proc.wait(10)
    wait_until(lambda: not leases.held(call_id), 5, 0.1, what="the dead holder's lease to lapse")


def test_a_lease_let_go_is_not_written_again() -> None:
    """Its holder let it go: the renewing thread does not bring it back."""
    call_id = str(uuid.uuid4())
    proc = lease_holder(
        call_id, holding="time.sleep(1.5)", after="print('let go', flush=True); time.sleep(60)"
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "let go"
        for _ in range(30):  # three renewal periods
            assert not leases.held(call_id)
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(10)
