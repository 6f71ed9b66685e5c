"""PostgreSQL lost between the claim of a round's retry and its send, on the worker's send path
(`sending.call_send`) against a scripted 2026-07-28 server over HTTP and the real PostgreSQL: the retry never
left the hub, so the next task sends it, once, instead of ending the call ``outcome_unknown``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import InterfaceError, OperationalError, connection

from approvals.models import AuditEvent, InputRequest, McpServer, Membership, Round, ToolCall
from approvals.services import answers, rounds, sending
from tests import factories
from tests.test_sends_hostile import FORM, TOOLS, ScriptedServer, asking, done

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The retries an answer queues, kept here: this test sends them itself, as the task would."""
    kept: list[Any] = []
    monkeypatch.setattr(rounds, "enqueue_on_commit", lambda *args, **kwargs: kept.append(args))
    return kept


def test_a_database_lost_after_the_claim_and_before_the_send_leaves_the_retry_to_send_once(
    scripted: ScriptedServer, queued: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.script(asking({"name": FORM}, "s1"), done)
    release = factories.team("release")
    agent, _ = factories.agent("ci-bot")
    server = McpServer.objects.create(
        slug="scripted", name="scripted", url=scripted.url, default_team=release, tools=TOOLS
    )
    agent.servers.add(server)
    call = factories.call(server, agent, tool="plain", arguments={})
    alice = factories.user("alice")
    Membership.objects.create(team=release, user=alice, role=Membership.Role.REVIEWER)
    sending.call_send(call_id=call.pk)
    ir = InputRequest.objects.get(round__call=call, status=InputRequest.Status.PENDING)
    answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})
    assert queued, "the answer queues the retry"

    original = sending.input_responses
    lost: list[bool] = []

    def session_lost_then_read(rnd: Round) -> dict[str, Any]:
        if not lost:  # PostgreSQL restarts at this moment: the worker's session ends
            lost.append(True)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return original(rnd)

    monkeypatch.setattr(sending, "input_responses", session_lost_then_read)
    with pytest.raises((OperationalError, InterfaceError)):
        sending.call_send(call_id=call.pk)
    assert lost
    connection.close()
    assert len(scripted.calls) == 1  # the retry never left the hub

    sending.call_send(call_id=call.pk)  # the task again (redelivered, or beat's recover_stuck)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert len(scripted.calls) == 2
    assert scripted.calls[-1]["requestState"] == "s1"
    assert scripted.calls[-1]["inputResponses"] == {"name": {"action": "accept", "content": {"name": "Ada"}}}
    assert Round.objects.get(call=call, number=1).send_attempts == 1
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="round.resent").exists()
