"""The API's bearer tokens and per-address limits as an attacker meets them: addresses changed within one
IPv6 network, the Authorization header written otherwise, on the real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import uuid

import ninja.conf
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.cache import cache
from django.core.handlers.asgi import ASGIHandler
from django.test import Client, RequestFactory

from approvals.ratelimit import TokenRateThrottle, client_network
from tests import factories

pytestmark = pytest.mark.django_db


def _forget_count(agent: object) -> None:
    """The agent's requests taken off the per-token counters: its id comes again in the next run's fresh
    test database, and a test that lowers the rate must not find this test's requests there."""
    request = RequestFactory().get("/")
    request.auth = agent  # type: ignore[attr-defined]
    throttle = TokenRateThrottle(settings.ELICIT_API_RATE)
    window = int(throttle.timer() // throttle.duration)  # type: ignore[misc, operator]
    key = throttle.get_cache_key(request)
    cache.delete_many([f"{key}:{w}" for w in range(window - 1, window + 2)])


def _network() -> ipaddress.IPv6Network:
    """A /64 of this test's own (documentation range, random), as one host on an IPv6 network is given."""
    return ipaddress.IPv6Network((int(ipaddress.ip_address(factories.client_address())), 64), strict=False)


# --- the client's address ---------------------------------------------------------------------------------


def test_a_client_is_its_ipv4_address_or_its_ipv6_network() -> None:
    assert client_network("192.0.2.7") == "192.0.2.7"
    assert client_network("::ffff:192.0.2.7") == "192.0.2.7"  # the same client, however the socket writes it
    assert client_network("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64"
    assert client_network("2001:db8:1:2::1") == client_network("2001:db8:1:2:ffff::9")
    assert client_network("2001:db8:1:3::1") != client_network("2001:db8:1:2::1")
    assert client_network(" 192.0.2.7") == "192.0.2.7"  # from X-Forwarded-For, after a comma
    assert client_network("unknown") == "unknown"
    assert client_network(None) is None


def test_anonymous_requests_from_one_ipv6_network_share_one_count(settings) -> None:
    """Every request from a new address of the same /64 was a new client with a fresh count: a host given a
    /64 (as IPv6 hosts are) was never limited."""
    settings.ELICIT_API_ANON_RATE = "3/m"
    network = _network()
    client = Client()
    url = f"/api/v1/calls/{uuid.uuid4()}"
    statuses = [
        client.get(url, REMOTE_ADDR=str(network[i]), HTTP_AUTHORIZATION="Bearer eha_guess").status_code
        for i in range(1, 5)
    ]
    assert statuses == [401, 401, 401, 429]
    refused = client.get(url, REMOTE_ADDR=str(network[99]))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused["Retry-After"]) <= 2 * 60
    # Another network is another client.
    assert client.get(url, REMOTE_ADDR=str(_network()[1])).status_code == 401


def test_sign_in_guesses_from_one_ipv6_network_share_the_clients_limit(settings) -> None:
    """One client trying many names is refused past ELICIT_SIGN_IN_CLIENT_RATE, whichever of its network's
    addresses it sends from; the right password from there too, as from one address."""
    settings.ELICIT_SIGN_IN_CLIENT_RATE = "3/15m"
    network = _network()
    name = f"ines-{uuid.uuid4().hex[:8]}"
    factories.user(name)
    for i in range(1, 4):
        guess = {"username": f"guess-{i}-{name}", "password": "x"}
        response = Client().post("/accounts/login/", guess, REMOTE_ADDR=str(network[i]))
        assert response.status_code == 200
    response = Client().post(
        "/accounts/login/", {"username": name, "password": f"pw-{name}"}, REMOTE_ADDR=str(network[1000])
    )
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= 15 * 60
    elsewhere = Client().post(
        "/accounts/login/", {"username": name, "password": f"pw-{name}"}, REMOTE_ADDR=str(_network()[1])
    )
    assert elsewhere.status_code == 302


# --- the Authorization header -----------------------------------------------------------------------------


def test_a_token_sent_under_another_scheme_is_refused_and_never_logged(settings, caplog) -> None:
    """django-ninja logged the whole header, the token in it, whenever the scheme was not Bearer (with DEBUG
    on, as in development)."""
    settings.DEBUG = True
    server = factories.server("deploy")
    _, token = factories.agent("ci-bot", servers=[server])
    url = f"/api/v1/calls/{uuid.uuid4()}"
    address = factories.client_address()
    with caplog.at_level(logging.DEBUG):
        for header in (f"Token {token}", f"Basic {token}", token):
            response = Client().get(url, REMOTE_ADDR=address, HTTP_AUTHORIZATION=header)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "unauthorized"
            assert token not in response.content.decode()
    assert token not in caplog.text
    assert token[4:] not in caplog.text


def test_the_scheme_in_any_case_and_more_than_one_space_before_the_token() -> None:
    """RFC 7235 allows one or more spaces after the scheme; the gateway accepted them, the API took the
    second space as part of the token and answered 401."""
    server = factories.server("deploy")
    agent, token = factories.agent("ci-bot", servers=[server])
    url = f"/api/v1/calls/{uuid.uuid4()}"
    for header in (f"Bearer {token}", f"bearer {token}", f"BEARER  {token}", f"Bearer   {token}"):
        response = Client().get(url, HTTP_AUTHORIZATION=header)
        assert response.status_code == 404, header  # signed in: the call is not found
    _forget_count(agent)
    # What is not the token is still refused: a token with something after it, nothing after the scheme,
    # characters no token has.
    address = factories.client_address()
    for header in (f"Bearer {token} x", f"Bearer {token}x", "Bearer", "Bearer  ", "Bearer eha_\u00e9\u00e9"):
        response = Client().get(url, REMOTE_ADDR=address, HTTP_AUTHORIZATION=header)
        assert response.status_code == 401, header
        assert response.json()["error"]["code"] == "unauthorized"


def _asgi_get(path: str, headers: list[tuple[bytes, bytes]], client: str) -> tuple[int, dict]:
    """A GET through Django's ASGI handler, as the servers make it: a header may come more than once."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "client": (client, 40000),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    received: list[bool] = []

    async def receive() -> dict:
        if not received:
            received.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays: Django stops listening when it has answered
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    async_to_sync(ASGIHandler())(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


@pytest.mark.django_db(transaction=True)  # Django's ASGI handler closes the connection around a request
def test_two_authorization_headers_are_no_one() -> None:
    """Two Authorization lines, each with a valid token: the request is neither agent's."""
    server = factories.server("deploy")
    agents = [factories.agent(name, servers=[server]) for name in ("ci-bot", "other-bot")]
    headers = [(b"authorization", f"Bearer {token}".encode()) for _, token in agents]
    url, address = f"/api/v1/calls/{uuid.uuid4()}", factories.client_address()
    assert _asgi_get(url, headers[:1], address)[0] == 404  # one of them alone signs in
    status, body = _asgi_get(url, headers, address)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    _forget_count(agents[0][0])


def test_behind_one_proxy_a_forged_forwarded_for_line_is_not_the_client(settings, monkeypatch) -> None:
    """ELICIT_NUM_PROXIES=1: the address the proxy added (its own header line, as HAProxy's forwardfor adds
    it, after the client's forged one) is the client's; the forged one changes nothing."""
    monkeypatch.setattr(ninja.conf.settings, "NUM_PROXIES", 1)  # read from Django's settings at import
    settings.ELICIT_API_ANON_RATE = "2/m"
    network = _network()
    statuses = []
    for i in range(3):
        headers = [
            (b"x-forwarded-for", f"198.51.100.{i}".encode()),  # forged: a new address each time
            (b"x-forwarded-for", str(network[i + 1]).encode()),  # the proxy's
        ]
        statuses.append(_asgi_get(f"/api/v1/calls/{uuid.uuid4()}", headers, "127.0.0.1")[0])
    assert statuses == [401, 401, 429]
