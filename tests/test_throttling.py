"""Sign-in and anonymous API throttling, on the real PostgreSQL and the Redis cache the limiter uses."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import pytest
from django.contrib.auth import SESSION_KEY
from django.core.cache import cache
from django.test import Client
from ninja.throttling import AnonRateThrottle

from approvals.throttling import FailureThrottle
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def address() -> Iterator[str]:
    """A client address of this test's own (documentation range), its counters cleared before and after."""
    addr = factories.client_address()

    def forget() -> None:
        request = Client().get("/").wsgi_request
        request.META["REMOTE_ADDR"] = addr
        keys = [FailureThrottle("sign-in-client", "1/m").get_cache_key(request)]
        keys.append(AnonRateThrottle("1/m").get_cache_key(request) or "")
        cache.delete_many(keys)

    forget()
    yield addr
    forget()


def sign_in(client: Client, username: str, password: str, address: str) -> object:
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_after_too_many_wrong_passwords_even_the_right_one_is_refused(settings, address) -> None:
    settings.ELICIT_SIGN_IN_USER_RATE = "5/15m"
    name = f"dora-{uuid.uuid4().hex[:8]}"
    factories.user(name)
    client = Client()
    for _ in range(5):
        response = sign_in(client, name, "wrong", address)
        assert response.status_code == 200
        assert "The user name and password do not match" in response.content.decode()

    response = sign_in(client, name, f"pw-{name}", address)
    assert response.status_code == 429
    retry_after = int(response["Retry-After"])
    assert 0 < retry_after <= 15 * 60  # until the first failure is 15 minutes old
    minutes = math.ceil(retry_after / 60)
    assert f"Too many attempts, try again in {minutes} minutes." in response.content.decode()
    assert SESSION_KEY not in client.session  # not signed in

    # The admin's sign-in is the same backend: refused there too, with the same status and wait.
    admin = client.post("/admin/login/", {"username": name, "password": f"pw-{name}"}, REMOTE_ADDR=address)
    assert SESSION_KEY not in client.session and admin.status_code == 429
    assert 0 < int(admin["Retry-After"]) <= 15 * 60
    assert "Too many attempts, try again in" in admin.content.decode()
    # A wrong password that is not throttled is still the plain form again.
    other = f"olga-{uuid.uuid4().hex[:8]}"
    factories.user(other)
    wrong = Client().post(
        "/admin/login/",
        {"username": other, "password": "wrong"},
        REMOTE_ADDR=factories.client_address(),
    )
    assert wrong.status_code == 200


def test_the_count_is_per_user_name_and_successes_do_not_count(settings, address) -> None:
    settings.ELICIT_SIGN_IN_USER_RATE = "3/15m"
    dora, emil = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("dora", "emil"))
    factories.user(dora)
    factories.user(emil)
    for _ in range(3):
        assert sign_in(Client(), dora, "wrong", address).status_code == 200
    assert sign_in(Client(), dora.upper(), f"pw-{dora}", address).status_code == 429  # any spelling
    for _ in range(4):  # another name from the same client, signing in rightly: never counted
        client = Client()
        assert sign_in(client, emil, f"pw-{emil}", address).status_code == 302
        assert client.session[SESSION_KEY]


def test_one_client_trying_many_names_is_refused_too(settings, address) -> None:
    settings.ELICIT_SIGN_IN_CLIENT_RATE = "4/15m"
    name = f"fred-{uuid.uuid4().hex[:8]}"
    factories.user(name)
    for i in range(4):
        assert sign_in(Client(), f"guess-{i}-{name}", "wrong", address).status_code == 200
    assert sign_in(Client(), name, f"pw-{name}", address).status_code == 429
    client = Client()  # the same person from elsewhere is not held back
    assert sign_in(client, name, f"pw-{name}", "192.0.2.1").status_code == 302


def test_anonymous_api_requests_are_limited_per_client(settings, address) -> None:
    settings.ELICIT_API_ANON_RATE = "3/m"
    client = Client()
    url = f"/api/v1/calls/{uuid.uuid4()}"
    for _ in range(3):
        response = client.get(url, REMOTE_ADDR=address, HTTP_AUTHORIZATION="Bearer not-a-token")
        assert response.status_code == 401
    response = client.get(url, REMOTE_ADDR=address)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(response["Retry-After"]) <= 2 * 60  # a sliding window: two periods at most
    # A valid token is not anonymous: the agent is limited by its own token's rate, not the address's.
    server = factories.server("deploy")
    _, token = factories.agent("ci-bot", servers=[server])
    response = client.get(url, REMOTE_ADDR=address, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 404
