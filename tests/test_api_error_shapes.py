"""Errors the API answers outside its views keep its JSON shape: a fault in a middleware (the 500 handler),
and a 405 whose message names what its ``Allow`` header lists."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals import outage

pytestmark = pytest.mark.django_db


def test_a_fault_outside_a_view_under_the_api_is_a_json_500(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> bool:
        raise ValueError("a fault in a middleware")

    monkeypatch.setattr(outage, "redis_answers", broken)
    client = Client(raise_request_exception=False)

    api = client.post("/api/v1/calls", data={}, content_type="application/json")
    page = client.post("/accounts/login/", {"username": "x"})

    assert api.status_code == 500
    assert api["Content-Type"].startswith("application/json")
    assert api.json()["error"]["code"] == "internal_error"
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")


def test_a_405_names_the_methods_its_allow_header_lists() -> None:
    answer = Client().put("/api/v1/calls/00000000-0000-0000-0000-000000000000")

    assert answer.status_code == 405
    allowed = answer["Allow"]
    assert "HEAD" in allowed
    assert answer.json()["error"]["message"] == f"PUT is not allowed here; allowed: {allowed}."
