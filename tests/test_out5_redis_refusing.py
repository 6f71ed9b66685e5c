"""A Redis that answers but refuses writes is an outage too: out of memory under ``maxmemory`` (``OOM``), a
replica since a failover (``READONLY``), or unable to save its snapshot (``MISCONF``). The hub took each for
a fault of its own: every API request was a 500 (the rate limiter's count is a write), and a write passed the
check that Redis answers PING (or, under MISCONF, failed in it with a 500). Now the limits are counted in
process memory, as while Redis is unreachable, and a write is refused with the 503 (Retry-After) before
anything is stored.

Each test runs on a Redis of its own (never the suite's), which it puts in the refusing state.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest
import redis
from django.conf import settings
from django.test import Client, RequestFactory, override_settings

from approvals import outage
from approvals.models import ToolCall
from approvals.ratelimit import TokenRateThrottle
from approvals.redis_cache import RedisCache
from tests import factories
from tests.live import free_port, wait_until
from tests.test_outage_broker import StoppableRedis

pytestmark = pytest.mark.django_db


def out_of_memory(server: redis.Redis, own: StoppableRedis) -> None:
    server.config_set("maxmemory-policy", "noeviction")
    server.config_set("maxmemory", "1")  # below what Redis itself uses: every write is refused


def read_only(server: redis.Redis, own: StoppableRedis) -> None:
    server.replicaof("127.0.0.1", free_port())  # a replica of nothing: serves reads, refuses writes


def unable_to_save(server: redis.Redis, own: StoppableRedis) -> None:
    """A snapshot that failed (its folder is gone): Redis refuses writes, and PING, with MISCONF."""
    server.config_set("save", "3600 1")  # snapshots on: a failed one stops writes
    shutil.rmtree(own.dir)
    server.bgsave()

    def failed() -> bool:
        persistence = server.info("persistence")
        return not persistence["rdb_bgsave_in_progress"] and persistence["rdb_last_bgsave_status"] == "err"

    wait_until(failed, 20, 0.05, what="the failed snapshot")


REFUSALS = [
    pytest.param(out_of_memory, id="oom"),
    pytest.param(read_only, id="readonly"),
    pytest.param(unable_to_save, id="misconf"),
]


@pytest.fixture(params=REFUSALS)
def refusing_redis(request: pytest.FixtureRequest) -> Iterator[str]:
    """The hub's cache on a Redis of the test's own that answers reads and refuses every write."""
    own = StoppableRedis().start()
    refuse: Callable[[redis.Redis, StoppableRedis], None] = request.param
    caches = {"default": {**settings.CACHES["default"], "LOCATION": own.url}}
    server = redis.Redis.from_url(own.url)
    try:
        refuse(server, own)
        assert server.get("written") is None  # it answers
        with pytest.raises(redis.exceptions.ResponseError):
            server.set("written", "1")
        with override_settings(CACHES=caches):
            yield own.url
    finally:
        server.config_set("save", "")  # no snapshot to take on the way out, which would fail again
        server.close()
        own.remove()


def test_the_rate_limit_is_kept_in_memory_while_redis_refuses_writes(refusing_redis: str) -> None:
    throttle = TokenRateThrottle("3/m")
    throttle.cache = RedisCache(refusing_redis, {"OPTIONS": {"socket_timeout": 2}})
    request = RequestFactory().get("/api/v1/inbox")
    request.auth = f"agent-{refusing_redis}"  # type: ignore[attr-defined]

    assert [throttle.allow_request(request) for _ in range(4)] == [True, True, True, False]
    wait = throttle.wait()  # until the window's count has slid out far enough: within two periods
    assert wait is not None and 1 <= wait <= 2 * 60 and wait == int(wait)


def test_the_api_reads_and_refuses_writes_with_a_503_while_redis_refuses_writes(refusing_redis: str) -> None:
    assert not outage.redis_answers()
    deploy = factories.server("deploy")
    _, token = factories.agent("ci-bot", servers=[deploy])
    agent = Client(headers={"authorization": f"Bearer {token}"}, raise_request_exception=False)

    read = agent.get("/api/v1/calls/00000000-0000-0000-0000-000000000000")
    assert read.status_code == 404, read.content[:300]
    assert read.json()["error"]["code"] == "not_found"

    sent = agent.post(
        "/api/v1/calls", {"server": "deploy", "tool": "t", "arguments": {}}, content_type="application/json"
    )
    assert sent.status_code == 503, sent.content[:300]
    assert sent.json()["error"]["code"] == "engine_unavailable"
    assert sent["Retry-After"] == str(outage.RETRY_AFTER)
    assert not ToolCall.objects.exists()


def test_a_dashboard_form_gets_the_readable_503_while_redis_refuses_writes(refusing_redis: str) -> None:
    browser = Client(raise_request_exception=False)
    browser.force_login(factories.user("alice"))

    response = browser.post("/requests/00000000-0000-0000-0000-000000000000/respond/", {"action": "accept"})

    assert response.status_code == 503
    assert response["Retry-After"] == str(outage.RETRY_AFTER)
    assert "Temporarily unavailable" in response.content.decode()
