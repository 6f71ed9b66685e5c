"""A send a worker claimed and never finished (the worker was killed), on a server that needs a session by
the time it is recovered (its era set to the handshake era in the admin, or found so by a later probe).

Holders take only calls nobody has claimed (``queued``); a call a worker claimed is the workers' to finish.
Before, recovery handed it to the holders, which never take a ``running`` call: it stayed ``running`` for
ever, re-queued every minute, and its unknown outcome was never reported."""

from __future__ import annotations

import pytest

from approvals import tasks
from approvals.models import McpServer, ToolCall
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import set_up_hub
from tests.live import CeleryWorker, child_env, wait_until

pytestmark = pytest.mark.timeout(180)


def test_a_claimed_send_whose_server_now_needs_a_session_still_ends(worker, demo_server) -> None:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)
    worker.kill()
    # Killed after the claim, before the request leaves: the hub cannot know that the server never saw it.
    doomed = CeleryWorker(
        child_env(**WORKER_ENV, ELICIT_TEST_PAUSE_BEFORE_SEND="30"),
        name="oncerev-doomed-handover",
        module="tests.fault_worker",
    ).start()
    try:
        call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
        wait_until(
            lambda: ToolCall.objects.filter(pk=call_id, status=ToolCall.Status.RUNNING, attempts=1).exists(),
            30,
            what="the claim",
        )
    finally:
        doomed.kill()
    McpServer.objects.filter(pk=hub.server.pk).update(era=McpServer.Era.HANDSHAKE)
    worker.start()

    def ended() -> bool:
        tasks.recover_stuck(grace_seconds=0)  # what beat does every minute
        return ToolCall.objects.get(pk=call_id).is_final

    wait_until(ended, 30, 1.0, what="the orphaned call to end")
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "outcome_unknown"
    assert call.holder_id is None
    assert demo_support.recorded_requests(demo_server.url) == []  # never sent, and not sent now
    shown = hub.agent.get(f"/calls/{call_id}").json()
    assert (shown["status"], shown["error"]["code"]) == ("failed", "outcome_unknown")
