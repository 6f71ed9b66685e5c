"""The reviewers' POST endpoints as scripts meet them on the wire, where Django checks CSRF: a missing,
revoked or wrong kind of token is told so, and counts against the anonymous limit; a signed-in browser
still needs its CSRF token (docs/api.md, "Errors")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import cache
from django.db import models
from django.test import Client, RequestFactory

from approvals.models import InputRequest, Membership, PersonalToken
from approvals.ratelimit import TokenRateThrottle
from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending() -> InputRequest:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    return factories.open_round(
        factories.call(factories.server("deploy")), team_=release
    ).input_requests.get()


def _wire(**headers: Any) -> Client:
    """A client as a script is on the wire: no CSRF cookie, and Django's CSRF check on (the test client
    skips it otherwise)."""
    return Client(
        enforce_csrf_checks=True,
        raise_request_exception=False,
        REMOTE_ADDR=factories.client_address(),
        **headers,
    )


def _cancel(client: Client, ir: InputRequest) -> Any:
    body = json.dumps({"action": "cancel"})
    return client.post(f"/api/v1/input-requests/{ir.pk}/respond", body, content_type="application/json")


def test_a_script_whose_token_was_revoked_is_told_401_not_a_csrf_failure(pending: InputRequest) -> None:
    """Its bot renews a token on a 401; a 403 "CSRF check Failed" sent it looking for a CSRF token instead."""
    record, token = tokens.personal_token_create(user=factories.user("bob"))
    PersonalToken.objects.filter(pk=record.pk).delete()
    for client in (_wire(HTTP_AUTHORIZATION=f"Bearer {token}"), _wire()):
        response = _cancel(client, pending)
        assert response.status_code == 401, response.content
        assert response.json()["error"]["code"] == "unauthorized"
        assert response["WWW-Authenticate"] == 'Bearer realm="elicit-hub"'
        revoke = client.post("/api/v1/grants/00000000-0000-0000-0000-000000000000/revoke")
        assert revoke.status_code == 401, revoke.content
    pending.refresh_from_db()
    assert pending.status == InputRequest.Status.PENDING


def test_an_agents_token_on_a_reviewers_post_is_named_the_wrong_kind(pending: InputRequest) -> None:
    _, token = factories.agent("ci-bot")
    response = _cancel(_wire(HTTP_AUTHORIZATION=f"Bearer {token}"), pending)
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "wrong_token_kind"
    pending.refresh_from_db()
    assert pending.status == InputRequest.Status.PENDING


def test_posts_without_a_valid_credential_count_against_the_anonymous_limit(
    pending: InputRequest, settings: Any
) -> None:
    """Token guesses sent as POSTs to a reviewer's endpoint were refused for CSRF before the anonymous limit
    was reached, so they were never limited."""
    settings.ELICIT_API_ANON_RATE = "2/m"
    client = _wire(HTTP_AUTHORIZATION="Bearer ehp_guess")
    statuses = [_cancel(client, pending).status_code for _ in range(3)]
    assert statuses == [401, 401, 429]


def test_a_signed_in_browser_still_needs_its_csrf_token(pending: InputRequest) -> None:
    browser = _wire()
    browser.force_login(factories.user("carol", is_superuser=True))
    response = _cancel(browser, pending)
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "forbidden"
    pending.refresh_from_db()
    assert pending.status == InputRequest.Status.PENDING


def _forget_counts(*credentials: models.Model) -> None:
    """The per-token counters of these rows cleared: ids repeat in the next run's fresh test database, and
    its counters in Redis may still hold this run's requests."""
    throttle = TokenRateThrottle("1/m")
    window = int(throttle.timer() // 60)  # type: ignore[misc]
    for credential in credentials:
        request = RequestFactory().get("/")
        request.auth = credential  # type: ignore[attr-defined]
        key = throttle.get_cache_key(request)
        cache.delete_many([f"{key}:{w}" for w in range(window - 1, window + 2)])


def test_a_token_refused_for_its_kind_still_counts_on_its_limit(settings: Any) -> None:
    """Neither the token's limit (reached only by a credential the endpoint takes) nor the anonymous one
    counted these: a valid token could be sent to the other kind's endpoints without any limit."""
    settings.ELICIT_API_RATE = "2/m"
    agent, agent_token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    bob = factories.user("bob")
    _, personal_token = tokens.personal_token_create(user=bob)
    _forget_counts(agent, bob)
    try:
        as_agent = _wire(HTTP_AUTHORIZATION=f"Bearer {agent_token}")
        statuses = [as_agent.get("/api/v1/inbox").status_code for _ in range(3)]
        assert statuses == [403, 403, 429]
        refused = as_agent.get("/api/v1/inbox")
        assert refused.json()["error"]["code"] == "rate_limited"
        # A sliding window: the next request fits once enough of this minute's count has slid out, which
        # early in the minute is up to a minute and a half away.
        assert 1 <= int(refused["Retry-After"]) <= 90

        as_reviewer = _wire(HTTP_AUTHORIZATION=f"Bearer {personal_token}")
        body = json.dumps({"server": "deploy", "tool": "t"})
        statuses = [
            as_reviewer.post("/api/v1/calls", body, content_type="application/json").status_code
            for _ in range(3)
        ]
        assert statuses == [403, 403, 429]
    finally:
        _forget_counts(agent, bob)
