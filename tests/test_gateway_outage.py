"""While PostgreSQL is down the gateway answers 503 with Retry-After and its JSON error, as the REST API does
(``approvals.outage``), never a bare 500; once PostgreSQL is back it serves again.

As ``test_fault`` stops the database under the API: the test starts an embedded PostgreSQL of its own in a
temporary directory (never the suite's), migrates it, runs the real gateway process against it and stops
it while an agent holds a valid token.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from approvals import outage
from elicit_hub import engines
from tests.live import ROOT, child_env, wait_until
from tests.test_gateway import Gateway

pytestmark = pytest.mark.timeout(180)

# `migrate` (with its system checks) and the set-up in one process: one Django start-up, not two.
SET_UP = """
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0, skip_checks=False)
from approvals.services import tokens
_, token = tokens.agent_create(name="outage-agent", servers=[])
print("TOKEN=" + token)
"""
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "outage-test", "version": "1"},
    },
}


@dataclass
class World:
    pg: engines.Postgres
    gateway: Gateway
    token: str

    def initialize(self, path: str = "/mcp") -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json, text/event-stream"}
        return httpx.post(self.gateway.url + path, json=INITIALIZE, headers=headers, timeout=30)


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture
def world() -> Iterator[World]:
    # Not pytest's tmp_path (see test_fault): the embedded PostgreSQL may run as another user.
    root = Path(tempfile.mkdtemp(prefix="elicit-gateway-outage-"))
    pg = engines.Postgres(root=root / "pg")
    gateway = None
    try:
        pg.start()
        env = child_env(
            DATABASE_URL=pg.url(),
            ELICIT_NAMESPACE=f"gateway-outage-{uuid.uuid4().hex[:6]}",
            # While PostgreSQL is down each request waits this long for a connection before its 503.
            ELICIT_DB_POOL_TIMEOUT="1",
        )
        found = re.search(r"TOKEN=(\S+)", _manage(env, "shell", "-c", SET_UP))
        assert found
        gateway = Gateway(env).start()
        yield World(pg, gateway, found.group(1))
    finally:
        if gateway is not None:
            gateway.stop()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_with_postgresql_down_the_gateway_answers_503_with_retry_after_and_recovers(world: World) -> None:
    assert world.initialize().status_code == 200

    world.pg.stop()
    assert not world.pg.is_running()
    for path in ("/mcp", "/mcp/demo"):
        response = world.initialize(path)
        assert response.status_code == 503, (response.status_code, response.text)
        assert response.headers["retry-after"] == str(outage.RETRY_AFTER)
        assert response.headers["content-type"] == "application/json"
        error = json.loads(response.content)["error"]
        assert error["code"] == "engine_unavailable" and "database" in error["message"]

    world.pg.start()
    wait_until(lambda: world.initialize().status_code == 200, 30, 0.3, what="the gateway after PostgreSQL")
