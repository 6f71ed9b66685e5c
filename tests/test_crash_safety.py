"""A worker killed with SIGKILL before, during or after sending a resume: the call still completes, nothing
is left stuck, and the tool's side effect runs exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from approvals import tasks
from approvals.models import AuditEvent, Round, ToolCall
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import set_up_hub
from tests.live import CeleryWorker, child_env, wait_until

pytestmark = pytest.mark.timeout(180)


def retries_sent(demo_url: str) -> list[dict]:
    return [
        r
        for r in demo_support.recorded_requests(demo_url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]


def kill_once_the_tool_ran(hub: Any, worker: CeleryWorker, demo_url: str, call_id: str) -> None:
    """The reviewer answers; the server runs the tool and holds its answer 4 s; the worker (the shared one)
    dies before it learns the outcome."""
    item = hub.reviewer.wait_for_request(call_id, "environment")
    demo_support.hold(demo_url, "create_deployment", "after", 4)
    try:
        assert hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200
        wait_until(
            lambda: demo_support.executions(demo_url).get("create_deployment") == 1,
            30,
            what="the tool to run",
        )
        worker.kill()
    finally:
        worker.kill()


def recovered(worker: CeleryWorker, call_id: str) -> ToolCall:
    """The call once final, after the worker started again and what beat's recover_stuck does every minute
    (the send is claimed but no worker holds its lock)."""
    worker.start()
    wait_until(
        lambda: tasks.recover_stuck(grace_seconds=0) >= 0 and ToolCall.objects.get(pk=call_id).is_final,
        60,
        1.0,
        what="the call to finish after recovery",
    )
    return ToolCall.objects.get(pk=call_id)


@pytest.mark.parametrize("phase", ["before", "during", "after"])
def test_a_killed_worker_never_runs_the_tool_twice(phase: str, worker, demo_server) -> None:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
    item = hub.reviewer.wait_for_request(call_id, "environment")

    # The worker we will kill at the chosen moment: one pausing after its claim (`before`), else the shared
    # worker itself (the same settings, no fault injected; the `worker` fixture restarts it for later tests).
    doomed = worker
    if phase == "before":
        worker.kill()
        crash_env = {**WORKER_ENV, "ELICIT_TEST_PAUSE_BEFORE_SEND": "30"}
        doomed = CeleryWorker(
            child_env(**crash_env), name=f"doomed-{phase}", module="tests.fault_worker"
        ).start()
    elif phase == "during":
        demo_support.hold(demo_server.url, "create_deployment", "before", 4)
    else:
        demo_support.hold(demo_server.url, "create_deployment", "after", 4)
    try:
        assert hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200
        rnd = Round.objects.get(call_id=call_id, number=1)
        if phase == "before":
            wait_until(
                lambda: Round.objects.get(pk=rnd.pk).status == Round.Status.SENDING, 30, what="the claim"
            )
            assert retries_sent(demo_server.url) == []
        elif phase == "during":
            demo_support.wait_for_held(demo_server.url, 1, timeout=30)
            assert demo_support.executions(demo_server.url).get("create_deployment", 0) == 0
        else:
            wait_until(
                lambda: demo_support.executions(demo_server.url).get("create_deployment") == 1,
                30,
                what="the tool to run",
            )
        doomed.kill()
    finally:
        doomed.kill()

    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.RESUMING
    call = recovered(worker, call_id)
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert call.result["isError"] is False
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.CLOSED
    sent = retries_sent(demo_server.url)
    assert {r["headers"]["idempotency-key"] for r in sent} == {f"elicit-{call_id}-r1"}
    assert len(sent) == (1 if phase == "before" else 2)
    assert rnd.send_attempts == 2


def test_a_killed_worker_leaves_an_unsafe_tool_outcome_unknown_never_run_twice(worker, demo_server) -> None:
    """The server does not honour Idempotency-Key and the tool is not idempotent: after the crash the hub
    cannot know whether the tool ran, so it says so instead of sending it again."""
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
    kill_once_the_tool_ran(hub, worker, demo_server.url, call_id)
    call = recovered(worker, call_id)
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "outcome_unknown"
    assert call.error["tool_may_have_run"] is True
    assert Round.objects.get(call_id=call_id, number=1).status == Round.Status.CLOSED
    # Sent once, run once; the audit log records no re-send.
    assert not AuditEvent.objects.filter(call_id=call_id, verb="round.resent").exists()
    assert len(retries_sent(demo_server.url)) == 1
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
