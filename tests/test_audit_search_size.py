"""The audit log's search vector (a trigger on every append) for events as large as the hub accepts."""

from __future__ import annotations

import pytest
from django.contrib.postgres.search import SearchQuery

from approvals.models import AuditEvent, ToolCall
from tests import factories
from tests.hub import Agent

pytestmark = pytest.mark.django_db


def _words(count: int) -> str:
    """`count` distinct words: PostgreSQL refuses a search vector over 1 MB, and distinct words are what fill
    one (each word once, with its position)."""
    return " ".join(f"w{n:x}" for n in range(count))


def test_a_call_whose_arguments_are_many_distinct_words_is_taken_and_searchable() -> None:
    """About 770 KB of distinct words (under the 1 MB body limit) made a search vector PostgreSQL refused, so
    the call's audit event could never be stored: the agent was told the database was down, for good."""
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    notes = "needle " + _words(120_000)
    assert len(notes) > 750_000
    response = Agent(token).post(
        "/calls", {"server": "deploy", "tool": "create_deployment", "arguments": {"notes": notes}}
    )
    assert response.status_code == 202, response.content
    call = ToolCall.objects.get(pk=response.json()["id"])
    submitted = AuditEvent.objects.filter(call_id=call.pk, verb="call.submitted")
    assert submitted.count() == 1
    # Its words are still found, those at its start at least, and its own columns in full.
    assert submitted.filter(search=SearchQuery("needle", config="simple")).exists()
    assert submitted.filter(search=SearchQuery("create_deployment", config="simple")).exists()


def test_a_small_events_strings_are_searched_as_before_and_its_keys_are_not() -> None:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    response = Agent(token).post(
        "/calls", {"server": "deploy", "tool": "create_deployment", "arguments": {"branchname": "hotfix"}}
    )
    submitted = AuditEvent.objects.filter(call_id=response.json()["id"], verb="call.submitted")
    assert submitted.filter(search=SearchQuery("hotfix", config="simple")).exists()
    assert not submitted.filter(search=SearchQuery("branchname", config="simple")).exists()


def test_a_limit_of_postgresqls_own_is_not_reported_as_an_outage() -> None:
    """A value PostgreSQL refuses as too large fails every retry the same way: not a 503 to retry after."""
    import psycopg.errors
    from django.db import OperationalError

    from approvals import outage

    too_large = OperationalError("string is too long for tsvector")
    too_large.__cause__ = psycopg.errors.ProgramLimitExceeded("string is too long for tsvector")
    assert outage.engine_of(too_large) is None
    gone = OperationalError("connection failed")
    gone.__cause__ = psycopg.OperationalError("connection failed")
    assert outage.engine_of(gone) == "postgresql"
