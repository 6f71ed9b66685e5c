"""HEAD on the dashboard's pages is answered as their GET is, without the body (RFC 9110 9.3.2), as it is on
the API: the pages that take GET alone answered 405 to monitors and link checkers. A streamed export is not
produced for a HEAD."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser() -> Client:
    client = Client()
    client.force_login(factories.user("root", is_staff=True, is_superuser=True))
    return client


@pytest.mark.parametrize("path", ["/", "/audit/", "/grants/", "/audit/head.json", "/api/v1/inbox"])
def test_head_answers_as_get_without_the_body(browser: Client, path: str) -> None:
    got = browser.get(path)
    assert got.status_code == 200, got.content[:300]
    head = browser.head(path)
    assert head.status_code == 200
    assert head.content == b""
    assert head["Content-Type"] == got["Content-Type"]
    assert int(head["Content-Length"]) > 0
    assert head.has_header("Content-Security-Policy")


def test_a_streamed_export_is_not_produced_for_head(browser: Client) -> None:
    events = AuditEvent.objects.count()
    head = browser.head("/audit/export.csv")
    assert head.status_code == 200
    assert head["Content-Type"].startswith("text/csv")
    assert b"".join(head.streaming_content) == b""
    # The export records itself; a HEAD reads nothing, so whether it records does not hang on the body.
    assert AuditEvent.objects.count() - events <= 1


def test_a_page_s_405_lists_head_beside_get(browser: Client) -> None:
    refused = browser.post("/audit/")
    assert refused.status_code == 405
    assert [method.strip() for method in refused["Allow"].split(",")] == ["GET", "HEAD"]
