"""Sign-in throttling under attack: concurrent guesses, and clients that change address within their network,
on the real PostgreSQL and Redis."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.db import connection
from django.test import Client, RequestFactory

from approvals import throttling
from approvals.throttling import FailureThrottle
from tests import factories

pytestmark = pytest.mark.django_db

GUESSES = 12


def _sign_in_request(address: str) -> Any:
    return RequestFactory().post("/accounts/login/", REMOTE_ADDR=address)


def _forget(address: str, name: str) -> None:
    request = _sign_in_request(address)
    keys = [
        FailureThrottle("sign-in-client", "1/m").get_cache_key(request),
        FailureThrottle("sign-in-user", "1/m", name.casefold()).get_cache_key(request),
    ]
    cache.delete_many(keys)


class Stalled:
    """Holds every password check until each of `expected` sign-ins is either being checked or has been
    refused: the interleaving of a burst of concurrent guesses, all of them past the throttle before any of
    their failures is known. Counts the password checks made."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.checking = 0
        self.refused = 0
        self.open = False
        self.cond = threading.Condition()
        self.real = ModelBackend.authenticate

    def method(self) -> Any:
        """ModelBackend.authenticate, stalled."""

        def authenticate(backend: Any, request: Any, **credentials: Any) -> Any:
            return self.check(backend, request, **credentials)

        return authenticate

    def check(self, backend: Any, request: Any, **credentials: Any) -> Any:
        with self.cond:
            self.checking += 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.open, timeout=30)
        return self.real(backend, request, **credentials)

    def done_without_check(self) -> None:
        with self.cond:
            self.refused += 1
            self.cond.notify_all()

    def release_when_all_arrived(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.checking + self.refused == self.expected, timeout=30)
            self.open = True
            self.cond.notify_all()


def test_concurrent_wrong_passwords_get_no_more_checks_than_the_limit(settings, monkeypatch) -> None:
    """Twelve guesses at once for one name allowed five failures: five passwords are checked, seven refused
    unheard, and the right password is refused afterwards. The throttle read the failures, checked the
    password, then wrote the failure: every guess of a burst passed the check before any was counted (and
    the read-append-write of the list lost some of them besides)."""
    settings.ELICIT_SIGN_IN_USER_RATE = "5/15m"
    settings.ELICIT_SIGN_IN_CLIENT_RATE = "1000/15m"
    name = f"gina-{uuid.uuid4().hex[:8]}"
    address = factories.client_address()
    _forget(address, name)
    stalled = Stalled(GUESSES)
    monkeypatch.setattr(ModelBackend, "authenticate", stalled.method())
    results: list[Any] = []

    def guess(i: int) -> None:
        try:
            request = _sign_in_request(address)
            results.append(authenticate(request, username=name, password=f"guess-{i}"))
            if getattr(request, throttling.RETRY_AFTER, None):
                stalled.done_without_check()
        finally:
            connection.close()

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(GUESSES)]
    for t in threads:
        t.start()
    stalled.release_when_all_arrived()
    for t in threads:
        t.join()
    try:
        assert results == [None] * GUESSES
        assert stalled.checking == 5
        assert stalled.refused == GUESSES - 5
        # Five failures are counted, no more and no fewer: the right password now waits too.
        factories.user(name)
        monkeypatch.setattr(ModelBackend, "authenticate", stalled.real)
        response = Client().post(
            "/accounts/login/", {"username": name, "password": f"pw-{name}"}, REMOTE_ADDR=address
        )
        assert response.status_code == 429
    finally:
        _forget(address, name)


def test_a_right_password_is_not_counted_and_a_refused_attempt_is_not_either(settings) -> None:
    settings.ELICIT_SIGN_IN_USER_RATE = "2/15m"
    name = f"hugo-{uuid.uuid4().hex[:8]}"
    factories.user(name)
    address = factories.client_address()
    _forget(address, name)
    try:
        for _ in range(5):  # signing in rightly, again and again: never counted
            assert authenticate(_sign_in_request(address), username=name, password=f"pw-{name}")
        for _ in range(2):
            assert authenticate(_sign_in_request(address), username=name, password="wrong") is None
        refused = _sign_in_request(address)
        assert authenticate(refused, username=name, password=f"pw-{name}") is None
        wait = getattr(refused, throttling.RETRY_AFTER)
        assert 14 * 60 < wait <= 15 * 60  # until the first of the two failures is 15 minutes old
        client = cache._cache.get_client(None)  # type: ignore[attr-defined]
        key = cache.make_and_validate_key(
            FailureThrottle("sign-in-user", "1/m", name.casefold()).get_cache_key(refused)
        )
        assert client.zcard(key) == 2  # the refused attempts left no trace
        assert 0 < client.ttl(key) <= 15 * 60 + 1
    finally:
        _forget(address, name)
