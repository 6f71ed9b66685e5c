"""A send whose worker lost its PostgreSQL session mid-send, with a second worker free to take the call.

The call's advisory lock went with the lost session; the worker holding the server's answer writes it once
PostgreSQL answers again. Before the send lease, beat's `recover_stuck` handed the call to the other worker
meanwhile, which found the send claimed and never released and ended the call ``outcome_unknown`` while the
server was still running it; the answer that came after was thrown away."""

from __future__ import annotations

import time

import pytest

from approvals import tasks
from approvals.models import AuditEvent, Round, ToolCall
from approvals.services import leases
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import set_up_hub
from tests.live import CeleryWorker, child_env, wait_until
from tests.test_crash_safety import retries_sent
from tests.test_oncerev_record import _end_sessions_of

pytestmark = pytest.mark.timeout(180)


def test_a_second_worker_waits_for_the_live_sender_of_a_call(worker, demo_server) -> None:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)  # not safe to send again
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    second = CeleryWorker(child_env(**WORKER_ENV), name="oncerev-lease").start()
    try:
        demo_support.hold(demo_server.url, "create_deployment", "after", 6)
        assert hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200
        wait_until(
            lambda: demo_support.executions(demo_server.url).get("create_deployment") == 1,
            30,
            what="the tool to run",
        )
        assert leases.held(call_id)  # the sending worker's lease, live while it waits for the answer
        # Whichever worker sends loses its sessions, and with them the call's lock; the other is idle.
        assert _end_sessions_of(worker.proc.pid) + _end_sessions_of(second.proc.pid) >= 1
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # beat, every minute; here while the answer is held
            tasks.recover_stuck(grace_seconds=0)
            assert not ToolCall.objects.get(pk=call_id).is_final
            time.sleep(0.5)
        wait_until(lambda: ToolCall.objects.get(pk=call_id).is_final, 60, 0.5, what="the call to finish")
    finally:
        second.stop()
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert Round.objects.get(call_id=call_id, number=1).status == Round.Status.CLOSED
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    assert len(retries_sent(demo_server.url)) == 1
    assert not AuditEvent.objects.filter(call_id=call_id, verb="round.resent").exists()
    assert not leases.held(call_id)  # let go once the answer is written
