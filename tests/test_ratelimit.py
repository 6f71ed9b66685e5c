"""The API's rate limits (`approvals.ratelimit`): sliding-window counters on the real Redis, atomic across
concurrent requests, one integer per window whatever the rate, in process memory while Redis is away."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.core.cache import cache
from django.core.cache.backends.redis import RedisCache
from django.test import Client, RequestFactory

from approvals.api import endpoints
from approvals.ratelimit import AnonymousRateThrottle, TokenRateThrottle, estimate, wait_for
from tests import factories

PERIOD = 60


def _request(credential: str | None = None, address: str = "192.0.2.7") -> Any:
    request = RequestFactory().get("/api/v1/inbox", REMOTE_ADDR=address)
    request.auth = credential
    return request


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def _throttle(rate: str, clock: Clock | None = None) -> TokenRateThrottle:
    throttle = TokenRateThrottle(rate)
    if clock is not None:
        throttle.timer = clock  # type: ignore[assignment]
    return throttle


# --- the arithmetic ---------------------------------------------------------------------------------------


def test_the_estimate_weighs_the_previous_window_by_what_is_left_of_it() -> None:
    assert estimate(10, 2, 0.0) == 12
    assert estimate(10, 2, 0.5) == 7
    assert estimate(10, 2, 1.0) == 2


def test_the_wait_is_until_one_more_request_fits() -> None:
    # 10 a minute, 10 in the last window, 1 in this one, 0.25 into it: 10 * 0.75 + 1 + 1 = 9.5 already fits.
    assert wait_for(10, 10, 1, 0.25, PERIOD) == 0
    # 9 here: 10 * (1 - e) + 10 <= 10 only when the last window has slid out: e = 1, 45 s from 0.25.
    assert wait_for(10, 10, 9, 0.25, PERIOD) == pytest.approx(45)
    # 10 here already: the next window, where this one's 10 must slide down to 9 (a tenth of it: 6 s).
    assert wait_for(10, 0, 10, 0.5, PERIOD) == pytest.approx(30 + 6)


# --- on Redis ---------------------------------------------------------------------------------------------


def test_a_token_gets_its_rate_and_the_next_request_is_refused_with_a_wait() -> None:
    token, other = f"agent-{uuid.uuid4()}", f"agent-{uuid.uuid4()}"
    clock = Clock(1_000_000 * PERIOD + 1)
    throttle = _throttle("5/m", clock)
    assert [throttle.allow_request(_request(token)) for _ in range(6)] == [True] * 5 + [False]
    # The burst must slide down to fit one more: the rest of this window and a fifth of the next.
    assert throttle.wait() == 71
    assert throttle.allow_request(_request(other))  # counted per credential
    # The refused request was taken off the count: when the window has slid past, requests get in again.
    clock.at += 2 * PERIOD
    assert throttle.allow_request(_request(token))


def test_a_burst_at_a_windows_edge_is_not_allowed_twice_over() -> None:
    token = f"agent-{uuid.uuid4()}"
    start = 2_000_000 * PERIOD
    clock = Clock(start + 50)
    throttle = _throttle("10/m", clock)
    assert all(throttle.allow_request(_request(token)) for _ in range(10))
    clock.at = start + PERIOD + 1  # a fixed window would start counting from zero here
    assert not throttle.allow_request(_request(token))
    clock.at = start + PERIOD + 55  # most of the last window has slid out
    assert throttle.allow_request(_request(token))


def test_concurrent_requests_are_all_counted() -> None:
    """Twenty requests at once against a limit of ten: ten get in. ninja's own throttle reads the list of
    timestamps, appends and writes it back, so concurrent requests overwrite each other's count."""
    token = f"agent-{uuid.uuid4()}"
    throttle = _throttle("10/h")
    barrier = threading.Barrier(20)
    allowed: list[bool] = []

    def one() -> None:
        barrier.wait()
        allowed.append(throttle.allow_request(_request(token)))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(allowed) == [False] * 10 + [True] * 10


def test_a_window_is_one_integer_whatever_the_rate() -> None:
    token = f"agent-{uuid.uuid4()}"
    clock = Clock(3_000_000 * PERIOD + 5)
    throttle = _throttle("100000/m", clock)
    for _ in range(500):
        assert throttle.allow_request(_request(token))
    key = throttle.get_cache_key(_request(token))
    stored = cache.make_and_validate_key(f"{key}:{3_000_000}")
    client: Any = cache._cache.get_client(stored)  # type: ignore[attr-defined]
    assert client.get(stored) == b"500"
    assert 0 < client.ttl(stored) <= 2 * PERIOD + 1


def test_while_redis_is_away_the_limit_is_kept_in_process_memory(caplog: pytest.LogCaptureFixture) -> None:
    token = f"agent-{uuid.uuid4()}"
    throttle = _throttle("3/m")
    # A Redis that refuses connections (nothing listens on port 9).
    throttle.cache = RedisCache(  # type: ignore[misc]
        "redis://127.0.0.1:9/0", {"OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}}
    )
    assert [throttle.allow_request(_request(token)) for _ in range(4)] == [True] * 3 + [False]
    assert throttle.wait() is not None
    assert "rate limit counted in process memory" in caplog.text


def test_anonymous_requests_are_counted_per_address() -> None:
    here, there = factories.client_address(), factories.client_address()
    throttle = AnonymousRateThrottle("2/h")
    assert [throttle.allow_request(_request(None, here)) for _ in range(3)] == [True, True, False]
    assert throttle.allow_request(_request("agent-x", here))  # a credential is not anonymous
    assert throttle.allow_request(_request(None, there))  # another address has its own count


# --- through the API --------------------------------------------------------------------------------------


def _api_limited_to(requests: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The API's per-token limit lowered to `requests` for this test; a server for the test's agents."""
    [throttle] = endpoints.api.throttle  # type: ignore[misc]
    monkeypatch.setattr(throttle, "num_requests", requests)
    return factories.server("deploy")


@pytest.mark.django_db
def test_the_api_answers_429_with_retry_after_past_a_tokens_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _api_limited_to(3, monkeypatch)
    _, token = factories.agent("ci-bot", servers=[server])
    _, neighbour = factories.agent("other-bot", servers=[server])
    client = Client()
    url = f"/api/v1/calls/{uuid.uuid4()}"
    statuses = [client.get(url, HTTP_AUTHORIZATION=f"Bearer {token}").status_code for _ in range(4)]
    assert statuses == [404, 404, 404, 429]
    refused = client.get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused["Retry-After"]) <= 2 * 60  # at most two periods
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {neighbour}").status_code == 404


@pytest.mark.django_db
def test_a_tokens_count_is_its_own_not_its_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renamed agent's count does not pass to the next agent given its old name."""
    server = _api_limited_to(2, monkeypatch)
    first, first_token = factories.agent("release-bot", servers=[server])
    client = Client()
    url = f"/api/v1/calls/{uuid.uuid4()}"
    statuses = [client.get(url, HTTP_AUTHORIZATION=f"Bearer {first_token}").status_code for _ in range(3)]
    assert statuses == [404, 404, 429]
    first.name = "retired-bot"
    first.save(update_fields=["name"])
    _, second_token = factories.agent("release-bot", servers=[server])
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {second_token}").status_code == 404
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {first_token}").status_code == 429
