"""A PostgreSQL that takes no writes (a standby the database's address leads to after a failover, or one set
``default_transaction_read_only``) refuses every write until it is a primary again: an outage for writes. The
hub answered each refused write with a 500 ("the fault is logged") instead of the 503 with Retry-After that
tells a client and a reviewer to send it again shortly; an API request with a token counts as a write
(its ``last_used_at``), so the API was a 500 throughout.

The server is made read-only for the request alone (``SET LOCAL transaction_read_only`` in a savepoint the
test rolls back), so the real server refuses the writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib.sessions.models import Session
from django.db import DataError, connection, transaction
from django.test import Client

from approvals import outage
from approvals.models import ToolCall
from tests import factories

pytestmark = pytest.mark.django_db

NO_CALL = "00000000-0000-0000-0000-000000000000"


class RolledBack(Exception):
    pass


@contextmanager
def rolled_back() -> Iterator[None]:
    """A savepoint, rolled back at the end (with what it set, and past any error inside it)."""
    with pytest.raises(RolledBack), transaction.atomic():
        yield
        raise RolledBack


@contextmanager
def read_only_server() -> Iterator[None]:
    with rolled_back():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL transaction_read_only = on")
        yield


def test_an_api_write_on_a_read_only_server_is_a_503_and_stores_nothing() -> None:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    agent = Client(headers={"authorization": f"Bearer {token}"}, raise_request_exception=False)

    with read_only_server():
        sent = agent.post(
            "/api/v1/calls",
            {"server": "deploy", "tool": "t", "arguments": {}},
            content_type="application/json",
        )

    assert sent.status_code == 503, sent.content[:300]
    assert sent["content-type"].startswith("application/json")
    error = sent.json()["error"]
    assert error["code"] == "engine_unavailable" and "nothing was stored" in error["message"]
    assert sent["Retry-After"] == str(outage.RETRY_AFTER)
    assert not ToolCall.objects.exists()


def test_signing_in_on_a_read_only_server_gets_the_readable_503() -> None:
    factories.user("alice")
    browser = Client(raise_request_exception=False)

    with read_only_server():
        response = browser.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})

    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == str(outage.RETRY_AFTER)
    page = response.content.decode()
    assert "Temporarily unavailable" in page and "send it again" in page
    assert not Session.objects.exists()


def test_another_internal_error_of_the_database_is_still_the_apis_json_500() -> None:
    """Only a read-only server's refusal is an outage: a statement in a transaction already failed is the
    hub's fault, answered as any other (JSON 500), not a 503 promising that a retry will do."""
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    agent = Client(headers={"authorization": f"Bearer {token}"}, raise_request_exception=False)
    with rolled_back():
        with pytest.raises(DataError), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")  # the transaction is failed: every later statement is refused
        answer = agent.get(f"/api/v1/calls/{NO_CALL}")

    assert answer.status_code == 500, answer.content[:300]
    assert answer.json()["error"]["code"] == "internal_error"
