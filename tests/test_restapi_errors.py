"""The API's answers to what a hostile or careless client sends, and to what anyone may ask without a token
(docs/api.md, "Errors")."""

from __future__ import annotations

import logging
from typing import Any

import ninja.main
import pytest
from django.test import Client

from approvals.models import InputRequest, Membership
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data", "multipart/form-data; boundary=\x01", "multipart/form-data; boundary="],
)
def test_a_signed_in_post_of_a_multipart_body_without_a_usable_boundary_is_a_400_not_a_500(
    content_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The session's CSRF check reads the form's token from the body a multipart Content-Type names; one it
    cannot split into parts is the caller's mistake, answered as such, and the input request stays pending."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    ir = factories.open_round(factories.call(factories.server("deploy")), team_=release).input_requests.get()
    browser = Client(
        enforce_csrf_checks=True, raise_request_exception=False, REMOTE_ADDR=factories.client_address()
    )
    browser.force_login(alice)
    browser.cookies["csrftoken"] = "c" * 32  # as a browser that loaded a page of the hub holds
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = browser.post(
            f"/api/v1/input-requests/{ir.pk}/respond", b"--x--", content_type=content_type
        )
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "invalid_body"
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING


def test_the_openapi_document_is_built_once_not_on_every_anonymous_request(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone may read /api/v1/openapi.json, with no token and no rate limit: building the document (tens of
    milliseconds of CPU) on each read let any client keep the web process busy at will."""
    first = client.get("/api/v1/openapi.json")
    assert first.status_code == 200
    builds: list[Any] = []
    build = ninja.main.get_schema

    def counted(**kwargs: Any) -> Any:
        builds.append(kwargs)
        return build(**kwargs)

    monkeypatch.setattr(ninja.main, "get_schema", counted)
    again = [client.get("/api/v1/openapi.json") for _ in range(3)]
    assert [response.status_code for response in again] == [200, 200, 200]
    assert all(response.content == first.content for response in again)
    assert builds == []


def test_a_host_the_hub_does_not_serve_gets_the_apis_json_error_and_a_page_elsewhere() -> None:
    """Django refuses a Host outside ALLOWED_HOSTS before any view: under /api/ the refusal keeps the API's
    error shape, and pages get the readable 400 page with the content policy still sent."""
    anyone = Client(raise_request_exception=False, HTTP_HOST="hub.attacker.example")
    api = anyone.get("/api/v1/inbox")
    assert api.status_code == 400
    assert api["Content-Type"].startswith("application/json")
    assert api.json()["error"]["code"] == "invalid_request" and api.json()["error"]["message"]
    page = anyone.get("/accounts/login/")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
    assert "default-src" in page["Content-Security-Policy"]
    assert "hub.attacker.example" not in page["Content-Security-Policy"]
