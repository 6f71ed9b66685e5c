"""Engine outages on a hub of its own: stop Redis, then PostgreSQL, while an agent and a reviewer work.

The test starts its own embedded PostgreSQL and Redis in a temporary directory (never the machine's, nor
the suite's), migrates them, and runs Daphne, a Celery worker and the demo MCP server against them. While
an engine is down the API answers JSON 503s with Retry-After and the dashboard a readable 503 page; after
the restart everything recovers; every request that got a 2xx is durable, every 503 stored nothing, and
no tool ran twice (the demo server's test hooks count executions).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from elicit_hub import engines
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.live import ROOT, CeleryWorker, Daphne, wait_until

pytestmark = pytest.mark.timeout(240)

PASSWORD = "pw-fault-alice-1234"
MIGRATE = """
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0, skip_checks=False)
"""
SET_UP = """
import json
from django.contrib.auth import get_user_model
from approvals.models import McpServer, Membership, Team
from approvals.services import tokens
alice = get_user_model().objects.create_user("alice", password=%r)
team = Team.objects.create(slug="release", name="Release")
Membership.objects.create(team=team, user=alice, role=Membership.Role.REVIEWER)
server = McpServer.objects.create(
    slug="demo", name="Deploy bot", url=%r, default_team=team, honours_idempotency_key=True
)
_, agent = tokens.agent_create(name="fault-agent", servers=[server])
_, reviewer = tokens.personal_token_create(user=alice)
print("TOKENS=" + json.dumps({"agent": agent, "reviewer": reviewer}))
"""


class World:
    def __init__(self, root: Path) -> None:
        self.pg = engines.Postgres(root=root / "pg")
        self.redis = engines.Redis(root=root / "redis")
        self.env: dict[str, str] = {}
        self.web: Daphne | None = None
        self.worker: CeleryWorker | None = None
        self.demo: demo_support.DemoServer | None = None
        self.tokens: dict[str, str] = {}
        self.helper = ThreadPoolExecutor(1)
        self.later: list[subprocess.Popen[str]] = []
        self.agent: httpx.Client
        self.reviewer: httpx.Client

    def start(self) -> None:
        # Processes start side by side, each started from this thread or the helper thread, which lives until
        # they have stopped: a process started from a thread ends with it (PR_SET_PDEATHSIG, tests.live).
        # The demo server needs neither engine: it starts while they start and the database is migrated.
        self.demo = demo_support.DemoServer()
        demo_up = self.helper.submit(self.demo.start)
        self._start_engines_and_set_up()
        demo_up.result()
        self.web = Daphne(self.env)
        self.worker = CeleryWorker(self.env, name="fault-worker")
        web_up = self.helper.submit(self.web.start)
        self.worker.start()
        web_up.result()
        self.agent = httpx.Client(
            base_url=self.web.url + "/api/v1",
            headers={"Authorization": f"Bearer {self.tokens['agent']}"},
            timeout=30,
        )
        self.reviewer = httpx.Client(
            base_url=self.web.url + "/api/v1",
            headers={"Authorization": f"Bearer {self.tokens['reviewer']}"},
            timeout=30,
        )

    def _start_engines_and_set_up(self) -> None:
        assert self.demo is not None
        self.pg.start()
        self.redis.start()
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}},
            **WORKER_ENV,
            "DATABASE_URL": self.pg.url(),
            "REDIS_URL": self.redis.url(),
            "ELICIT_NAMESPACE": f"fault-{uuid.uuid4().hex[:6]}",
            "DJANGO_SETTINGS_MODULE": "elicit_hub.settings",
            "PYTHONUNBUFFERED": "1",
            "ELICIT_REDIS_TIMEOUT": "1",
            # While PostgreSQL is down each request waits this long for a connection before its 503.
            "ELICIT_DB_POOL_TIMEOUT": "1",
            "ELICIT_OUTBOUND_ALLOW": "127.0.0.0/8,::1",  # the demo server listens on loopback
        }
        # `migrate` (with its system checks) and the set-up in one process: one Django start-up, not two.
        out = self.manage("shell", "-c", MIGRATE + SET_UP % (PASSWORD, self.demo.url))
        found = re.search(r"TOKENS=(\{.*\})", out)
        assert found, out
        self.tokens = json.loads(found.group(1))

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def manage_later(self, code: str) -> Callable[[], str]:
        """`manage.py shell -c code`, started now and run when the function returned is called (which returns
        its output); a process not called by then is ended by ``stop``."""
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", f"if input() == 'go':\n    {code}"],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.later.append(proc)

        def run() -> str:
            out, err = proc.communicate("go\n", timeout=60)
            assert proc.returncode == 0, err[-3000:]
            return out

        return run

    def stop(self) -> None:
        for proc in self.later:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.helper.submit(lambda: None).result()  # once a start still under way on the helper has ended
        for part in (self.worker, self.web):
            if part is not None:
                part.stop()
        if self.demo is not None:
            self.demo.stop()
        self.redis.stop()
        self.pg.stop()
        self.helper.shutdown()


@pytest.fixture
def world() -> Iterator[World]:
    # Not pytest's tmp_path: its root is reset to mode 0700 by every pytest run on the machine, and the
    # embedded PostgreSQL runs as an unprivileged user that must reach its data directory.
    root = Path(tempfile.mkdtemp(prefix="elicit-fault-"))
    w = World(root)
    try:
        w.start()
        yield w
    finally:
        w.stop()
        shutil.rmtree(root, ignore_errors=True)


def _is_503(response: httpx.Response) -> bool:
    if response.status_code != 503 or "Retry-After" not in response.headers:
        return False
    return response.json()["error"]["code"] == "engine_unavailable"


def _page_is_503(response: httpx.Response) -> bool:
    return (
        response.status_code == 503
        and "Retry-After" in response.headers
        and "Temporarily unavailable" in response.text
    )


def _submit(world: World, tool: str, key: str, arguments: dict[str, Any] | None = None) -> httpx.Response:
    body = {"server": "demo", "tool": tool, "arguments": arguments or {}, "idempotency_key": key}
    return world.agent.post("/calls", json=body)


def _signed_in(world: World) -> httpx.Client:
    assert world.web is not None
    browser = httpx.Client(base_url=world.web.url, timeout=30)
    page = browser.get("/accounts/login/")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert csrf
    signed = browser.post(
        "/accounts/login/",
        data={"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": csrf.group(1)},
        headers={"Referer": world.web.url + "/accounts/login/"},
    )
    assert signed.status_code == 302, signed.text[:500]
    return browser


def _answer_everything(world: World, call_id: str) -> dict[str, Any]:
    """Answer the call's input requests as they come until it is final; returns the final call."""
    answers = {"environment": {"environment": "staging"}, "confirm": {"confirm": True, "reason": "fault"}}

    def step() -> dict[str, Any] | None:
        call = world.agent.get(f"/calls/{call_id}").json()
        if call["status"] in {"completed", "failed", "cancelled", "expired"}:
            return call
        for item in world.reviewer.get("/inbox").json():
            if item["call"] == call_id and item["key"] in answers:
                world.reviewer.post(
                    f"/input-requests/{item['id']}/respond",
                    json={"action": "accept", "content": answers[item["key"]]},
                )
        return None

    return wait_until(step, 60, 0.2, what=f"call {call_id} to finish")  # type: ignore[return-value]


def test_outages_answer_503_store_nothing_and_recover(world: World) -> None:
    assert world.demo is not None
    accepted: dict[str, str] = {}  # idempotency key -> call id, for every 2xx
    refused: list[str] = []  # idempotency keys that got a 503
    browser = _signed_in(world)

    # All up: a call that needs a reviewer, and one that does not.
    response = _submit(world, "create_deployment", "deploy-1", {"branch": "main"})
    assert response.status_code == 202
    accepted["deploy-1"] = response.json()["id"]
    response = _submit(world, "echo", "echo-1", {"text": "one"})
    assert response.status_code == 202
    accepted["echo-1"] = response.json()["id"]
    environment = wait_until(
        lambda: next((i for i in world.reviewer.get("/inbox").json() if i["key"] == "environment"), None),
        30,
        0.1,
        what="the deploy's first input request",
    )

    # --- Redis down: reads still answer (the rate limit counts in memory); writes are 503s.
    world.redis.stop()
    assert not world.redis.is_running()
    for n in range(3):
        key = f"echo-redis-{n}"
        response = _submit(world, "echo", key, {"text": key})
        assert _is_503(response), (response.status_code, response.text)
        refused.append(key)
    refused_answer = world.reviewer.post(
        f"/input-requests/{environment['id']}/respond",
        json={"action": "accept", "content": {"environment": "staging"}},
    )
    assert _is_503(refused_answer), refused_answer.text
    assert world.agent.get(f"/calls/{accepted['echo-1']}").status_code == 200
    assert world.reviewer.get("/inbox").status_code == 200
    # A request without a valid token is still told so (its per-address limit counts in memory meanwhile).
    stranger = world.agent.get(f"/calls/{accepted['echo-1']}", headers={"Authorization": "Bearer nope"})
    assert stranger.status_code == 401, stranger.text
    assert browser.get("/audit/").status_code == 200
    assert _page_is_503(
        browser.post(
            f"/requests/{environment['id']}/respond/",
            data={"action": "accept"},
            headers={"X-CSRFToken": browser.cookies.get("csrftoken", "")},
        )
    )

    # Redis back: writes go through again.
    world.redis.start()
    response = wait_until(
        lambda: (r := _submit(world, "echo", "echo-2", {"text": "two"})).status_code == 202 and r,
        30,
        0.3,
        what="a call accepted after Redis restarted",
    )
    accepted["echo-2"] = response.json()["id"]  # type: ignore[union-attr]
    wait_until(
        lambda: world.agent.get(f"/calls/{accepted['echo-2']}").json()["status"] == "completed",
        60,
        0.2,
        what="the call after Redis restarted to complete",
    )

    # --- PostgreSQL down: every API request is a JSON 503; the dashboard shows the 503 page.
    world.pg.stop()
    assert not world.pg.is_running()
    for n in range(2):
        key = f"echo-pg-{n}"
        assert _is_503(_submit(world, "echo", key, {"text": key}))
        refused.append(key)
    assert _is_503(world.agent.get(f"/calls/{accepted['echo-1']}"))
    assert _is_503(world.agent.get(f"/calls/{accepted['echo-1']}", params={"wait": 1}))
    assert _is_503(world.reviewer.get("/inbox"))
    assert _is_503(
        world.reviewer.post(
            f"/input-requests/{environment['id']}/respond",
            json={"action": "accept", "content": {"environment": "staging"}},
        )
    )
    assert _page_is_503(browser.get("/"))
    assert _page_is_503(browser.get("/audit/"))

    # PostgreSQL back: everything recovers.
    world.pg.start()
    # The sweep below runs in a process of its own, which starts now (Django's start-up takes seconds).
    sweep = world.manage_later("from approvals.tasks import recover_stuck; recover_stuck(grace_seconds=0)")
    wait_until(
        lambda: world.agent.get(f"/calls/{accepted['echo-1']}").status_code == 200,
        30,
        0.3,
        what="reads after PostgreSQL restarted",
    )
    assert browser.get("/").status_code == 200
    response = _submit(world, "echo", "echo-3", {"text": "three"})
    assert response.status_code == 202
    accepted["echo-3"] = response.json()["id"]

    # A task the worker was taking from Redis as Redis stopped is gone with it (the broker had popped it and
    # not yet recorded it as unacknowledged): the call stays queued until beat's sweep (`recover_stuck`, for
    # calls no worker is sending) queues it again. Run the sweep as beat would, without its 90 s of grace; a
    # call queued twice must still run once (checked below).
    sweep()

    # Every 2xx is durable and finishes; the refused answer left its request pending for the reviewer.
    for key, call_id in accepted.items():
        final = _answer_everything(world, call_id)
        assert final["status"] == "completed", (key, final)
    # Every 503 stored nothing: the same idempotency key now makes a new call (202), not the old one (200).
    for key in refused:
        again = _submit(world, "echo", key, {"text": key})
        assert again.status_code == 202, (key, again.text)
        accepted[key] = again.json()["id"]
    for key in refused:
        assert _answer_everything(world, accepted[key])["status"] == "completed"

    # No tool ran twice: one run per accepted call.
    runs = demo_support.executions(world.demo.url)
    echoes = sum(1 for key in accepted if key.startswith("echo"))
    assert runs.get("echo", 0) == echoes, runs
    assert runs.get("create_deployment", 0) == 1, runs
