"""A send that kills its worker every time (a crash, the OOM killer), for a tool safe to repeat: each death
hands the send to another worker (beat's recover_stuck here; at once with a prefork pool, whose lost child's
task is rejected back to the queue), which sends it again. Safe to repeat is not for ever: after the tries a
failing server gets (ELICIT_MCP_MAX_RETRIES), the call ends ``outcome_unknown``."""

from __future__ import annotations

import pytest

from approvals import tasks
from approvals.models import AuditEvent, Round, ToolCall
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import set_up_hub
from tests.live import CeleryWorker, child_env, wait_until
from tests.test_crash_safety import retries_sent

pytestmark = pytest.mark.timeout(240)

MAX_RETRIES = int(WORKER_ENV["ELICIT_MCP_MAX_RETRIES"])


def test_a_send_that_kills_its_worker_each_time_is_not_sent_for_ever(worker, demo_server) -> None:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)  # honours Idempotency-Key: safe to send again
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
    item = hub.reviewer.wait_for_request(call_id, "environment")

    # The first try is held by the server; the later ones, with its Idempotency-Key, wait behind it: no worker
    # ever learns the outcome.
    demo_support.hold(demo_server.url, "create_deployment", "before", 120)
    deaths = 0
    for attempt in range(1, MAX_RETRIES + 3):
        # The first try's worker is the shared one (the same settings; the `worker` fixture restarts it for
        # later tests), each later try's a new one.
        doomed = worker
        if attempt > 1:
            doomed = CeleryWorker(child_env(**WORKER_ENV), name=f"oncerev-doomed-{attempt}").start()
        try:
            if attempt == 1:
                answered = hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
                assert answered.status_code == 200
            else:
                # What beat does every minute: once the dead worker's send lease has lapsed (3 s here).
                wait_until(lambda: tasks.recover_stuck(grace_seconds=0), 30, 0.5, what="the send recovered")
            wait_until(
                lambda tries=attempt: (
                    len(retries_sent(demo_server.url)) == tries or ToolCall.objects.get(pk=call_id).is_final
                ),
                30,
                0.1,
                what=f"try {attempt}",
            )
        finally:
            doomed.kill()
        if ToolCall.objects.get(pk=call_id).is_final:
            break
        deaths += 1

    assert deaths == MAX_RETRIES + 1
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "outcome_unknown"
    assert call.error["tool_may_have_run"] is True
    assert "ELICIT_MCP_MAX_RETRIES" in call.error["message"]
    assert len(retries_sent(demo_server.url)) == MAX_RETRIES + 1
    rnd = Round.objects.get(call_id=call_id, number=1)
    assert rnd.status == Round.Status.CLOSED
    # Each re-send is in the audit log; the try that was refused is not.
    assert AuditEvent.objects.filter(call_id=call_id, verb="round.resent").count() == MAX_RETRIES
    shown = hub.agent.get(f"/calls/{call_id}").json()
    assert shown["status"] == "failed"
    assert shown["error"]["code"] == "outcome_unknown"
    demo_support.reset(demo_server.url)  # lets the held requests go
