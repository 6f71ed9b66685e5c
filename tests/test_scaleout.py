"""Two web processes, two API servers and two Celery workers on one PostgreSQL and Redis, as
`launch --web 2 --api 2 --workers 2` runs.

Real processes (Daphne, uvicorn, Celery), the real engines, the demo MCP server, driven over HTTP and
websockets the way agents and reviewers use the hub behind the reverse proxy: /api/ on the API servers, the
sockets on the web processes. A reviewer's socket on either web process sees rounds opened for calls
submitted on either API server and sent by either worker; a long-poll on one API server is woken by a
finish that came from an answer posted on the other; across many calls nothing is lost or done twice.

The cluster has its own namespace (Celery queue, channel-layer and cache prefixes): the suite's shared
worker takes none of its tasks, so what these processes do is all these tests see.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import websockets
from asgiref.sync import async_to_sync
from django.test import Client

from approvals.audit import core as audit
from approvals.models import AuditEvent, McpServer, Membership, ToolCall
from approvals.services import tokens
from tests import demo_support, factories
from tests.conftest import WORKER_ENV
from tests.live import ApiServer, CeleryWorker, Daphne, child_env

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(300)]

CALLS = 12


@dataclass
class Cluster:
    webs: list[Daphne]
    apis: list[ApiServer]
    workers: list[CeleryWorker]


@pytest.fixture(scope="module")
def cluster(django_db_setup: None, demo_server: Any) -> Iterator[Cluster]:
    env = child_env(
        **WORKER_ENV,
        ELICIT_NAMESPACE=f"scaleout{os.getpid()}",
        ELICIT_API_RATE="1000000/m",  # the bots poll the inbox
    )
    webs = [Daphne(env), Daphne(env)]
    apis = [ApiServer(env), ApiServer(env)]
    workers = [CeleryWorker(env, name="scaleout-worker-a"), CeleryWorker(env, name="scaleout-worker-b")]
    try:
        for process in [*webs, *apis, *workers]:
            process.start()
        yield Cluster(webs, apis, workers)
    finally:
        for process in [*workers, *apis, *webs]:
            process.stop()


@dataclass
class People:
    agent_token: str
    reviewer_token: str
    cookie: str
    server: McpServer


@pytest.fixture
def people(demo_server: Any) -> People:
    alice = factories.user("alice")
    release = factories.team(f"release-{uuid.uuid4().hex[:8]}", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="demo",
        name="Deploy bot",
        url=demo_server.url,
        default_team=release,
        honours_idempotency_key=True,
    )
    _, agent_token = tokens.agent_create(name="ci-agent", servers=[server])
    _, reviewer_token = tokens.personal_token_create(user=alice)
    client = Client()
    client.force_login(alice)
    return People(agent_token, reviewer_token, client.cookies["sessionid"].value, server)


def _tasks_run(worker: CeleryWorker, since: int) -> int:
    log = worker.log()[since:]
    return sum(log.count(f"approvals.tasks.{name}[") for name in ("run_call", "resume_call")) // 2


class Socket:
    """A reviewer's queue socket on one web process, collecting the calls whose new round it showed."""

    def __init__(self, web: Daphne, cookie: str) -> None:
        self.web, self.cookie = web, cookie
        self.opened: dict[str, float] = {}
        self.ready = asyncio.Event()

    async def run(self) -> None:
        headers = {"Cookie": f"sessionid={self.cookie}", "Origin": self.web.url}
        url = self.web.url.replace("http", "ws", 1) + "/ws/queue/"
        async with websockets.connect(url, additional_headers=headers, max_size=2**22) as ws:
            async for raw in ws:
                message = json.loads(raw)
                if message["type"] == "hello":
                    self.ready.set()
                elif message["type"] == "card" and message.get("event") == "round.opened":
                    self.opened.setdefault(message["call"], time.time())


async def _inbox_item(reviewer: httpx.AsyncClient, call_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = await reviewer.get("/api/v1/inbox")
        assert response.status_code == 200, response.text
        for item in response.json():
            if item["call"] == call_id:
                return item
        await asyncio.sleep(0.2)
    raise AssertionError(f"call {call_id} never reached the inbox")


@dataclass
class Outcome:
    call: str
    submitted_on: int
    polled_on: int
    body: dict[str, Any]
    returned_at: float


async def _one_call(
    i: int, cluster: Cluster, agents: list[httpx.AsyncClient], reviewers: list[httpx.AsyncClient]
) -> Outcome:
    """Submit on one API server; long-poll and find the request on the other; answer on the first."""
    submit, other = i % 2, (i + 1) % 2
    response = await agents[submit].post(
        "/api/v1/calls",
        json={"server": "demo", "tool": "create_deployment", "arguments": {"branch": f"scale-{i}"}},
    )
    assert response.status_code == 202, response.text
    call_id = response.json()["id"]
    poll = asyncio.create_task(agents[other].get(f"/api/v1/calls/{call_id}", params={"wait": 90}))
    item = await _inbox_item(reviewers[other], call_id)
    answer = await reviewers[submit].post(
        f"/api/v1/input-requests/{item['id']}/respond",
        json={"action": "accept", "content": {"environment": "staging"}},
    )
    assert answer.status_code == 200, answer.text
    finished = await poll
    returned_at = time.time()
    assert finished.status_code == 200, finished.text
    return Outcome(call_id, submit, other, finished.json(), returned_at)


async def _run_calls(cluster: Cluster, people: People, count: int) -> tuple[list[Outcome], list[Socket]]:
    sockets = [Socket(web, people.cookie) for web in cluster.webs]
    listeners = [asyncio.create_task(socket.run()) for socket in sockets]
    await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in sockets)), 30)

    def client(web: Daphne, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=web.url, headers={"Authorization": f"Bearer {token}"}, timeout=120)

    agents = [client(api, people.agent_token) for api in cluster.apis]
    reviewers = [client(api, people.reviewer_token) for api in cluster.apis]
    try:
        outcomes = await asyncio.gather(*(_one_call(i, cluster, agents, reviewers) for i in range(count)))
        # The last cards may still be on their way to the other socket.
        deadline = time.monotonic() + 20
        ids = {o.call for o in outcomes}
        while time.monotonic() < deadline and not all(ids <= set(s.opened) for s in sockets):
            await asyncio.sleep(0.1)
    finally:
        for one in [*agents, *reviewers]:
            await one.aclose()
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
    return list(outcomes), sockets


def test_two_web_processes_and_two_workers_lose_nothing_and_do_nothing_twice(
    cluster: Cluster, people: People, demo_server: Any
) -> None:
    executed_before = demo_support.executions(demo_server.url).get("create_deployment", 0)
    log_marks = [len(worker.log()) for worker in cluster.workers]

    outcomes, sockets = async_to_sync(_run_calls)(cluster, people, CALLS)

    ids = [o.call for o in outcomes]
    assert len(set(ids)) == CALLS
    # Every long-poll, on the process that did not take the call nor the answer, got the finished call.
    assert [o.body["status"] for o in outcomes] == ["completed"] * CALLS
    assert all("staging" in o.body["result"]["content"][0]["text"] for o in outcomes)
    # Each socket (on Daphne) saw every new round of the calls submitted through the API servers.
    for socket in sockets:
        assert set(ids) <= set(socket.opened), f"{socket.web.url} missed {set(ids) - set(socket.opened)}"
    # Both workers sent calls (each call is run once by one of them, then resumed by one of them).
    ran = [_tasks_run(worker, mark) for worker, mark in zip(cluster.workers, log_marks, strict=True)]
    assert all(n > 0 for n in ran), ran
    assert sum(ran) >= CALLS, ran

    # Exactly once: one execution on the MCP server and one completion per call, one retry per round.
    assert demo_support.executions(demo_server.url).get("create_deployment", 0) - executed_before == CALLS
    retries = [
        r["headers"].get("idempotency-key")
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    assert all(retries.count(f"elicit-{call_id}-r1") == 1 for call_id in ids)
    completed = list(
        AuditEvent.objects.filter(verb="call.completed", call_id__in=ids).values_list("call_id", flat=True)
    )
    assert sorted(map(str, completed)) == sorted(ids)
    assert set(ToolCall.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"completed"}
    report = audit.verify()
    assert report.ok, report


def test_a_long_poll_on_one_api_server_is_woken_by_a_finish_on_the_other(
    cluster: Cluster, people: People
) -> None:
    """The long-poll re-reads the call every 5 s even without a notice; woken by the notice it returns
    within moments of the finish. Lags spread over 0-5 s would mean the notices did not cross processes."""
    outcomes, _ = async_to_sync(_run_calls)(cluster, people, 6)
    finished = dict(
        ToolCall.objects.filter(pk__in=[o.call for o in outcomes]).values_list("pk", "finished_at")
    )
    lags = [o.returned_at - finished[uuid.UUID(o.call)].timestamp() for o in outcomes]
    assert all(o.polled_on != o.submitted_on for o in outcomes)
    assert all(lag > -0.5 for lag in lags), lags  # nobody returned before the call was finished
    assert statistics.median(lags) < 1.5, lags
    assert max(lags) < 4.5, lags
