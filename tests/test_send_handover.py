"""An answer that arrives while the task that opened its round still holds the call's send lock.

The round opens (committed) before that task lets go of the lock; a reviewer answering at once queues a new
task, which finds the lock taken and gives up. The first task must then send the retry itself, or the
answer waits for `recover_stuck` (90 s). Everything here is real (the MCP test server over HTTP, PostgreSQL's
advisory lock, a second connection in a thread); the window is held open by running the answer and the
second task right after the first task's `_apply`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections

from approvals.models import Round, ToolCall
from approvals.services import answers, sending
from tests.test_mcp_client import LiveServer
from tests.test_send_reads import greeting_call

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]


def test_an_answer_given_while_the_round_s_sender_still_holds_the_lock_is_sent_by_it(
    mcp_test_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, call = greeting_call(mcp_test_server)
    apply = sending._apply
    second: list[Any] = []

    def apply_then_answer_at_once(send: Any, outcome: Any, *, received_at: Any) -> bool:
        due = apply(send, outcome, received_at=received_at)
        if send.round is None:  # the round just opened; this task still holds the lock
            ir = Round.objects.get(call=call).input_requests.get()
            answers.input_respond(
                input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"}
            )

            def task_queued_by_the_answer() -> None:
                try:
                    second.append(sending.call_send(call_id=call.pk))
                finally:
                    connections.close_all()

            worker = threading.Thread(target=task_queued_by_the_answer)
            worker.start()
            worker.join(timeout=30)
            assert Round.objects.get(call=call).status == Round.Status.READY  # the second task sent nothing
        return due

    monkeypatch.setattr(sending, "_apply", apply_then_answer_at_once)

    assert sending.call_send(call_id=call.pk) is None

    assert second == [None]
    # Sent by this task's second look, or (when a test worker runs beside this test and took its queued task
    # after the lock was let go) by that worker: either way at once, and once.
    deadline = time.monotonic() + 15
    call.refresh_from_db()
    while call.status != ToolCall.Status.COMPLETED and time.monotonic() < deadline:
        time.sleep(0.1)
        call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED, call.status
    assert call.result["content"][0]["text"].startswith("Hello, Ada!")
    assert Round.objects.get(call=call).send_attempts == 1
