"""HEAD on the API's GET addresses is the GET's answer without its body (RFC 9110 9.3.2), not a 405."""

from __future__ import annotations

import httpx
import pytest

from tests import factories
from tests.hub import Reviewer, off_the_loop
from tests.test_api import form_request
from tests.test_body_limit_wire import api_process  # noqa: F401  (the API server, uvicorn: a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer() -> Reviewer:
    from approvals.services import tokens

    alice = factories.user("alice")
    _, token = tokens.personal_token_create(user=alice)
    team = factories.team("release", (alice, "reviewer"))
    form_request(factories.server("deploy", default_team=team), team)
    return Reviewer(token)


def test_head_answers_as_get_without_the_body(reviewer: Reviewer) -> None:
    got = reviewer.get("/inbox")
    head = off_the_loop(reviewer.client.head, "/api/v1/inbox")
    assert got.status_code == head.status_code == 200
    assert head.content == b""
    assert head["Content-Length"] == str(len(got.content)) and len(got.content) > 2
    assert head["Inbox-Version"] == got["Inbox-Version"]
    assert head["Content-Type"] == got["Content-Type"]


def test_head_needs_the_same_credentials_as_get() -> None:
    head = off_the_loop(Reviewer("").client.head, "/api/v1/inbox")
    assert head.status_code == 401


def test_a_405_names_head_among_what_a_get_address_allows(reviewer: Reviewer) -> None:
    refused = reviewer.post("/inbox", {})
    assert refused.status_code == 405
    assert refused.json()["error"]["code"] == "method_not_allowed"
    assert [m.strip() for m in refused["Allow"].split(",")] == ["GET", "HEAD"]


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("live_db")
@pytest.mark.parametrize("server", ["daphne", "api"])
def test_head_over_the_wire(server: str, request: pytest.FixtureRequest) -> None:
    """Through Daphne and the API server (uvicorn): the GET's status and headers, no body, and the
    connection still good for the next request."""
    web = request.getfixturevalue("web_process" if server == "daphne" else "api_process")
    with httpx.Client(base_url=web.url, timeout=10) as client:
        head = client.head("/api/v1/calls/00000000-0000-0000-0000-000000000000")
        assert head.status_code == 401 and head.content == b""
        assert int(head.headers["content-length"]) > 0  # the GET's body, left out
        assert client.get("/accounts/login/").status_code == 200  # the same connection, in step
