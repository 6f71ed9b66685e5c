"""Held calls when their holder is declared lost while its process lives on, and questions whose answer was
recorded but never reached the server (on the real PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.mcp_client import TransientError
from approvals.models import AuditEvent, Holder, InputRequest, McpServer, Membership, Round, ToolCall
from approvals.services import answers, holding
from tests import factories

QUESTION = {
    "mode": "form",
    "message": "Which branch?",
    "requestedSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def setup() -> dict[str, Any]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server("held", default_team=release)
    agent, _ = factories.agent("bot", servers=[server])
    return {"alice": alice, "server": server, "agent": agent}


def _stale(holder: Holder) -> None:
    Holder.objects.filter(pk=holder.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))


def test_a_lost_holders_late_failure_does_not_end_the_call_another_holder_now_runs(
    setup: dict[str, Any],
) -> None:
    first = Holder.objects.create(name="holder-1")
    call = factories.call(setup["server"], setup["agent"], status=ToolCall.Status.RUNNING, holder=first)
    _stale(first)
    assert holding.holders_sweep() == 0  # never sent: back to the queue
    second = Holder.objects.create(name="holder-2")
    ToolCall.objects.filter(pk=call.pk).update(holder=second, status=ToolCall.Status.RUNNING)
    assert holding.held_sending(call_id=call.pk, holder_id=second.pk)

    # The first holder's process lives on; its session to the server fails before its own send.
    error = TransientError("connect_failed", "the server could not be reached")
    assert not holding.held_finish(call_id=call.pk, error=error, sent=False, holder_id=first.pk)

    call.refresh_from_db()
    assert call.status == ToolCall.Status.RUNNING
    assert call.holder_id == second.pk
    assert call.error is None


def test_an_answer_the_lost_holder_never_gave_the_server_is_not_shown_as_delivered(
    setup: dict[str, Any],
) -> None:
    holder = Holder.objects.create(name="holder-1")
    call = factories.call(setup["server"], setup["agent"], status=ToolCall.Status.RUNNING, holder=holder)
    assert holding.held_sending(call_id=call.pk, holder_id=holder.pk)
    opened = holding.push_open(call_id=call.pk, params=QUESTION)
    assert opened.round_id is not None
    ir = InputRequest.objects.get(round_id=opened.round_id)
    answers.input_respond(input_request_id=ir.pk, user=setup["alice"], action="accept", content={"text": "x"})
    assert Round.objects.get(pk=opened.round_id).status == Round.Status.READY

    _stale(holder)  # it died before it read the answer
    assert holding.holders_sweep() == 1

    rnd = Round.objects.get(pk=opened.round_id)
    assert rnd.status == Round.Status.CLOSED
    assert rnd.outcome == Round.Outcome.GONE
    gone = AuditEvent.objects.filter(verb="round.gone", call_id=call.pk).get()
    assert "the answer was not delivered" in gone.data["why"]
    call.refresh_from_db()
    assert call.status == ToolCall.Status.FAILED
    assert (call.error or {}).get("tool_may_have_run") is True
    # The server gets no answer from this round any more: a late read says cancel.
    assert holding.push_answer(round_id=rnd.pk) == {"action": "cancel"}


def test_a_slow_holder_declared_lost_cannot_come_back_while_its_calls_are_ended(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    McpServer.objects.filter(pk=setup["server"].pk).update(era=McpServer.Era.HANDSHAKE)
    holder = Holder.objects.create(name="holder-1")
    sent = factories.call(setup["server"], setup["agent"], status=ToolCall.Status.RUNNING, holder=holder)
    assert holding.held_sending(call_id=sent.pk, holder_id=holder.pk)
    queued = factories.call(setup["server"], setup["agent"], status=ToolCall.Status.QUEUED)
    _stale(holder)
    seen: dict[str, Any] = {}
    lose = holding._lose

    def holder_wakes_meanwhile(lost: Holder, why: str) -> int:
        # The holder's process was only slow: its heartbeat and its next claim come as its calls are ended.
        seen["beat"] = holding.holder_beat(holder_id=holder.pk, sessions=1)
        seen["claimed"] = holding.holder_claim(holder_id=holder.pk, limit=5)
        return lose(lost, why)

    monkeypatch.setattr(holding, "_lose", holder_wakes_meanwhile)
    assert holding.holders_sweep() == 1

    assert seen == {"beat": False, "claimed": []}  # told it is lost: it stops
    assert not Holder.objects.filter(pk=holder.pk).exists()
    assert (ToolCall.objects.get(pk=sent.pk).error or {}).get("code") == "holder_lost"
    assert ToolCall.objects.get(pk=queued.pk).status == ToolCall.Status.QUEUED
    assert AuditEvent.objects.filter(verb="holder.lost").count() == 1


def test_a_holder_a_sweep_marked_lost_but_did_not_end_is_ended_by_the_next(setup: dict[str, Any]) -> None:
    holder = Holder.objects.create(name="holder-1")
    sent = factories.call(setup["server"], setup["agent"], status=ToolCall.Status.RUNNING, holder=holder)
    assert holding.held_sending(call_id=sent.pk, holder_id=holder.pk)
    Holder.objects.filter(pk=holder.pk).update(heartbeat_at=holding.LOST)  # that sweep stopped there

    assert holding.holders_sweep() == 1
    assert not Holder.objects.filter(pk=holder.pk).exists()
    assert ToolCall.objects.get(pk=sent.pk).status == ToolCall.Status.FAILED
