"""The API's rate limits while Redis is down: counted in process memory (README, "While an engine is down"),
and said once per outage in the log, not once per request: an API serving hundreds of requests a second
wrote as many warnings a second, burying everything else in the log. Once Redis answers again, the log
says so, and a later outage is logged again.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from django.test import RequestFactory

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
