"""The same run_call delivered several times at once to two real workers (a duplicate enqueue, a message
Redis hands out again, beat's recovery) while the round's retry is in flight: the retry is sent once, the
tool runs once, and the call completes."""

from __future__ import annotations

import pytest
from celery import current_app

from approvals import queueing, tasks
from approvals.models import AuditEvent, Round, ToolCall
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import set_up_hub
from tests.live import CeleryWorker, child_env, wait_until
from tests.test_crash_safety import retries_sent

pytestmark = pytest.mark.timeout(180)


def test_duplicate_deliveries_to_two_workers_send_the_retry_once(worker, demo_server) -> None:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)  # a re-send would run it again
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    second = CeleryWorker(child_env(**WORKER_ENV), name="oncerev-second").start()
    seen = len(second.log())
    try:
        demo_support.hold(demo_server.url, "create_deployment", "before", 3)
        assert hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200
        demo_support.wait_for_held(demo_server.url, 1, timeout=30)
        for _ in range(3):
            current_app.send_task(queueing.RUN_CALL, args=[call_id])
        tasks.recover_stuck(grace_seconds=0)  # the send is locked: nothing to recover
        body = hub.agent.wait(call_id, 30)
        assert body["status"] == "completed", body
        # Both workers took a message: the one that sent, and the other (each duplicate found the lock taken).
        wait_until(lambda: "succeeded" in second.log()[seen:], 30, what="the second worker to take a task")
    finally:
        second.stop()
    tasks.run_call.apply(args=[call_id])  # a duplicate late, after the call ended: nothing to send

    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.COMPLETED
    assert len(retries_sent(demo_server.url)) == 1
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    rnd = Round.objects.get(call_id=call_id, number=1)
    assert (rnd.status, rnd.send_attempts) == (Round.Status.CLOSED, 1)
    assert not AuditEvent.objects.filter(call_id=call_id, verb="round.resent").exists()
    assert AuditEvent.objects.filter(call_id=call_id, verb="call.completed").count() == 1
