"""An answer that commits just as the broker (Redis) goes away: its retry's task is lost with the broker, the
answer is not. The reviewer's request succeeds; the round waits ``ready`` in PostgreSQL; beat's
recover_stuck queues the retry again once Redis is back (it judges a round stuck 90 s after its answer, and
runs every minute: the retry goes 90 to 150 s after the answer), and the tool runs once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from approvals.models import InputRequest, Round, ToolCall
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import set_up_hub
from tests.live import CeleryWorker, child_env, wait_until
from tests.test_outage_broker import RECOVER, StoppableRedis, _manage

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def broker() -> Iterator[StoppableRedis]:
    server = StoppableRedis().start()
    try:
        yield server
    finally:
        server.remove()


ANSWER = """
from django.contrib.auth import get_user_model
from approvals.services import answers
answers.input_respond(
    input_request_id="{pk}", user=get_user_model().objects.get(username="alice"),
    action="accept", content={{"environment": "staging"}},
)
print("ANSWERED")
"""


def test_an_answer_committed_while_the_broker_is_down_is_resumed_once_redis_is_back(
    worker: CeleryWorker, demo_server: demo_support.DemoServer, broker: StoppableRedis
) -> None:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})  # sent by the suite's worker
    item = hub.reviewer.wait_for_request(call_id, "environment")
    env = child_env(REDIS_URL=broker.url, ELICIT_REDIS_TIMEOUT="1", **WORKER_ENV)

    broker.stop()
    answered = _manage(env, "shell", "-c", ANSWER.format(pk=item["id"]))
    assert answered.returncode == 0, answered.stderr[-3000:]
    assert "ANSWERED" in answered.stdout
    assert "enqueue_on_commit(approvals.tasks.run_call" in answered.stderr  # logged: the task was not queued
    assert InputRequest.objects.get(pk=item["id"]).status == InputRequest.Status.ANSWERED
    assert Round.objects.get(call_id=call_id, number=1).status == Round.Status.READY
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.RESUMING

    broker.start()
    # beat's sweep and a worker, both on the Redis that is back: the sweep's process starts while the worker
    # does (the task it queues waits in Redis for the worker).
    with ThreadPoolExecutor(1) as pool:
        recovering = pool.submit(_manage, env, "shell", "-c", RECOVER)
        resumer = CeleryWorker(env, name="oncerev-broker-answer").start()
    try:
        recovered = recovering.result()
        assert recovered.returncode == 0, recovered.stderr[-3000:]
        assert re.search(r"REQUEUED=1\b", recovered.stdout), recovered.stdout
        wait_until(lambda: ToolCall.objects.get(pk=call_id).is_final, 60, 0.2, what="the resumed call")
    finally:
        resumer.stop()
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    assert Round.objects.get(call_id=call_id, number=1).send_attempts == 1
