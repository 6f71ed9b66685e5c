"""The API's rate limits while Redis is down: counted in process memory (README, "While an engine is down"),
and said once per outage in the log, not once per request: an API serving hundreds of requests a second
wrote as many warnings a second, burying everything else in the log. Once Redis answers again, the log
says so, and a later outage is logged again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import RequestFactory

from approvals import ratelimit
from approvals.ratelimit import TokenRateThrottle
from approvals.redis_cache import RedisCache
from tests.live import unreachable_redis_url

pytestmark = pytest.mark.django_db

AWAY = "rate limit counted in process memory"
BACK = "rate limit counted in Redis again"


def _request(credential: str) -> Any:
    request: Any = RequestFactory().get("/api/v1/inbox", REMOTE_ADDR="192.0.2.7")
    request.auth = credential
    return request


def _unreachable_redis() -> RedisCache:
    options = {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}
    return RedisCache(unreachable_redis_url(), {"OPTIONS": options})


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(
        text in record.getMessage() for record in caplog.records if record.name == "approvals.ratelimit"
    )


def test_redis_away_is_logged_once_per_outage_not_per_request(caplog: pytest.LogCaptureFixture) -> None:
    token = f"agent-{uuid.uuid4()}"
    up = TokenRateThrottle("1000/m")  # the real Redis (the "default" cache)
    down = TokenRateThrottle("1000/m")
    down.cache = _unreachable_redis()
    assert up.allow_request(_request(token))  # Redis answers: any earlier test's outage is over
    caplog.clear()

    with caplog.at_level(logging.INFO, logger="approvals.ratelimit"):
        assert all(down.allow_request(_request(token)) for _ in range(20))
        assert _messages(caplog, AWAY) == 1
        assert _messages(caplog, BACK) == 0

        assert up.allow_request(_request(token))
        assert up.allow_request(_request(token))
        assert _messages(caplog, BACK) == 1

        assert all(down.allow_request(_request(token)) for _ in range(5))
        assert _messages(caplog, AWAY) == 2

        assert up.allow_request(_request(token))  # leaves the process counting in Redis, as it found it
        assert _messages(caplog, BACK) == 2


@pytest.fixture
def hanging_redis_url() -> Iterator[str]:
    """A Redis that takes connections and never answers (a stopped process, a full network path)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_a_hanging_redis_costs_one_wait_then_requests_count_in_memory_until_it_is_tried_again(
    hanging_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each try of a Redis that never answers waits out its timeout (with the cache's one retry, twice): paid
    by every request, an API in front of a stopped Redis answered nothing faster than that. Now the first
    request pays it, the next ones within RECHECK_AFTER are counted in memory at once, and after it Redis
    is tried again."""
    monkeypatch.setattr(ratelimit, "_retry_at", {}, raising=False)  # this test's pauses end with it
    token = f"agent-{uuid.uuid4()}"
    hanging = TokenRateThrottle("1000/m")
    hanging.cache = RedisCache(
        hanging_redis_url, {"OPTIONS": {"socket_connect_timeout": 0.3, "socket_timeout": 0.3}}
    )
    started = time.monotonic()
    assert hanging.allow_request(_request(token))
    assert time.monotonic() - started >= 0.3  # the first request waited for the timeout

    calls: list[str] = []
    counted = TokenRateThrottle._count

    def count(self: Any, *args: Any) -> tuple[int, int]:
        calls.append("redis")
        return counted(self, *args)

    monkeypatch.setattr(TokenRateThrottle, "_count", count)
    assert all(hanging.allow_request(_request(token)) for _ in range(10))
    assert calls == []  # not tried: counted in memory
    limited = TokenRateThrottle("3/m")
    limited.cache = hanging.cache
    other = f"agent-{uuid.uuid4()}"
    assert [limited.allow_request(_request(other)) for _ in range(4)] == [True, True, True, False]

    monkeypatch.setattr(ratelimit, "RECHECK_AFTER", 0.0)
    ratelimit._retry_at[id(hanging.cache)] = time.monotonic()  # the pause is over
    assert hanging.allow_request(_request(token))
    assert calls == ["redis"]  # tried again (and, still hanging, counted in memory)

    up = TokenRateThrottle("1000/m")
    assert up.allow_request(_request(token))  # leaves the process counting in Redis, as it found it
