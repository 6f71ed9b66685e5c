"""On a PostgreSQL that takes no writes (a standby after a failover), reads with a token still answer: the
token's ``last_used_at`` is recorded best effort. Writing it was the one write of an API GET, so a read was
refused with a 503 for as long as the server stayed read-only; a write is still the 503.

The server is made read-only as in ``test_out5_postgres_read_only``: ``SET LOCAL transaction_read_only`` in a
savepoint the test rolls back.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import InternalError, connection
from django.test import Client
from django.utils import timezone

from approvals import outage
from approvals.models import AgentClient, Membership, PersonalToken, ToolCall
from approvals.services import tokens
from tests import factories
from tests.test_out5_postgres_read_only import read_only_server, rolled_back

pytestmark = pytest.mark.django_db


def api(token: str) -> Client:
    return Client(headers={"authorization": f"Bearer {token}"}, raise_request_exception=False)


def test_an_agents_read_on_a_read_only_server_answers_and_its_write_is_still_a_503(caplog) -> None:
    deploy = factories.server("deploy")
    agent, token = factories.agent("ci-bot", servers=[deploy])
    call = factories.call(deploy, agent)
    old = timezone.now() - timedelta(hours=1)
    AgentClient.objects.filter(pk=agent.pk).update(last_used_at=old)
    client = api(token)

    with caplog.at_level(logging.WARNING, logger="approvals.services.tokens"), read_only_server():
        read = client.get(f"/api/v1/calls/{call.pk}")
        # The request after it in the same transaction: the refused UPDATE left the connection usable.
        listed = client.get(f"/api/v1/calls/{call.pk}")
        sent = client.post(
            "/api/v1/calls",
            {"server": "deploy", "tool": "t", "arguments": {}},
            content_type="application/json",
        )

    assert read.status_code == 200, read.content[:300]
    assert read.json()["id"] == str(call.pk)
    assert listed.status_code == 200, listed.content[:300]
    assert sent.status_code == 503, sent.content[:300]
    assert sent.json()["error"]["code"] == "engine_unavailable"
    assert sent["Retry-After"] == str(outage.RETRY_AFTER)
    assert ToolCall.objects.count() == 1
    assert AgentClient.objects.get(pk=agent.pk).last_used_at == old
    warnings = [r.getMessage() for r in caplog.records if r.name == "approvals.services.tokens"]
    assert warnings and all("takes no writes" in w for w in warnings)
    assert not any(token in w or tokens.hash_token(token) in w for w in warnings)
    # Writable again: the next read records the use.
    assert client.get(f"/api/v1/calls/{call.pk}").status_code == 200
    assert AgentClient.objects.get(pk=agent.pk).last_used_at > old


def test_a_reviewers_inbox_on_a_read_only_server_answers() -> None:
    alice = factories.user("alice")
    factories.team("release", (alice, Membership.Role.REVIEWER))
    record, token = tokens.personal_token_create(user=alice)
    old = timezone.now() - timedelta(hours=1)
    PersonalToken.objects.filter(pk=record.pk).update(last_used_at=old)

    with read_only_server():
        inbox = api(token).get("/api/v1/inbox")

    assert inbox.status_code == 200, inbox.content[:300]
    assert inbox.json() == []
    assert PersonalToken.objects.get(pk=record.pk).last_used_at == old


def test_the_gateways_lookup_on_a_read_only_server_finds_the_token_and_leaves_the_connection_usable() -> None:
    agent, token = factories.agent("ci-bot")

    with read_only_server():
        found = tokens.authenticate(token)
        count = AgentClient.objects.count()

    assert isinstance(found, AgentClient) and found.pk == agent.pk
    assert found.last_used_at is None
    assert count == 1


def test_another_refusal_of_the_update_is_still_raised() -> None:
    """Only a server that takes no writes is let pass: another InternalError of the UPDATE (here a trigger's)
    is the hub's fault and is raised."""
    _, token = factories.agent("ci-bot")
    with rolled_back():
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE FUNCTION tok6_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'internal_error'; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER tok6_refuse BEFORE UPDATE ON {AgentClient._meta.db_table} "
                "FOR EACH ROW EXECUTE FUNCTION tok6_refuse()"
            )
        with pytest.raises(InternalError):
            tokens.authenticate(token)
