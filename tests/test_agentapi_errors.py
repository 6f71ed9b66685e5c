"""Every API error is JSON with a code and a message, whatever went wrong (docs/api.md, "Errors")."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from approvals.api import endpoints
from approvals.models import ToolCall
from tests import factories
from tests.hub import off_the_loop

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-in-the-exception"


@pytest.fixture
def token() -> str:
    return factories.agent("ci-bot", servers=[factories.server("deploy")])[1]


def test_an_unexpected_fault_is_a_json_500_that_names_no_detail(
    token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault the API did not foresee (a bug) is still the API's error shape; its detail goes to the log,
    not to the agent."""

    def failing(**kwargs: Any) -> Any:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(endpoints.calls, "call_submit", failing)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = off_the_loop(
            client.post, "/api/v1/calls", {"server": "deploy", "tool": "t"}, content_type="application/json"
        )
    assert response.status_code == 500
    assert response["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "internal_error" and error["message"]
    assert SECRET not in response.content.decode()
    logged = [r for r in caplog.records if r.exc_info and SECRET in str(r.exc_info[1])]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    assert not ToolCall.objects.exists()


def test_the_openapi_document_lists_the_500_and_the_503_of_every_endpoint(client: Client) -> None:
    """An agent generated from the OpenAPI document knows every error status the docs list."""
    document = client.get("/api/v1/openapi.json").json()
    operations = [op for item in document["paths"].values() for op in item.values()]
    assert operations
    for operation in operations:
        assert {"500", "503"} <= set(operation["responses"]), operation["operationId"]
