"""`create_agent` racing another creation of the same name: the one that loses says the agent exists
already (a CommandError, exit status 1), not a database traceback."""

from __future__ import annotations

import io
import threading
from typing import Any

import psycopg
from django.core.management import CommandError, call_command
from django.db import connection, connections

from approvals.models import AgentClient, AuditEvent
from tests import factories, live


def _insert_waits() -> bool:
    """Whether an INSERT of an agent waits for a lock (the other transaction's row with the same name)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE %s",
            ['%INSERT INTO "approvals_agentclient"%'],
        )
        return bool(cursor.fetchone()[0])


def test_create_agent_losing_a_race_for_its_name_says_the_agent_exists(live_db: None) -> None:
    factories.server("deploy")
    outcome: dict[str, Any] = {}

    def create() -> None:
        try:
            call_command("create_agent", "ci-bot", "--server", "deploy", stdout=io.StringIO())
        except Exception as exc:  # what the command ends with, whatever it is
            outcome["error"] = exc
        finally:
            connections.close_all()

    with psycopg.connect(live.test_database_url()) as other:
        # Another creation of "ci-bot", not committed yet: the command sees no such agent, and its insert
        # waits for this transaction.
        other.execute(
            "INSERT INTO approvals_agentclient (name, token_hash, token_prefix, webhook_secret, is_active, "
            "created_at) VALUES ('ci-bot', %s, 'eha_other', '', true, now())",
            ["0" * 64],
        )
        thread = threading.Thread(target=create)
        thread.start()
        try:
            live.wait_until(_insert_waits, what="create_agent's insert waiting for the other one")
        finally:
            other.commit()
            thread.join(30)
    error = outcome.get("error")
    assert isinstance(error, CommandError), repr(error)
    assert "an agent named 'ci-bot' exists already" in str(error)
    assert list(AgentClient.objects.values_list("token_prefix", flat=True)) == ["eha_other"]
    assert not AuditEvent.objects.filter(verb="agent.created").exists()
