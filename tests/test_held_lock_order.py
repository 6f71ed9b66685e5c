"""A held call (a holder runs it on a session) ending as its agent cancels it: both lock its open round and
the call, in one order (the round first, as an answer and a cancel do), so neither is aborted as a deadlock
(on the real PostgreSQL, two connections)."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.mcp_client import PermanentError
from approvals.models import Holder, InputRequest, Membership, Round, ToolCall
from approvals.services import calls, gates, holding
from tests import factories
from tests.test_leftover_gate_cancel import race

QUESTION = {
    "mode": "form",
    "message": "Which branch?",
    "requestedSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}


@pytest.fixture
def held_question() -> dict[str, Any]:
    """A call a holder runs, its server's question open in team release (alice's queue)."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server("held", default_team=release)
    holder = Holder.objects.create(name="holder-1")
    agent, _ = factories.agent("bot", servers=[server])
    call = factories.call(server, agent, status=ToolCall.Status.RUNNING, holder=holder)
    opened = holding.push_open(call_id=call.pk, params=QUESTION)
    assert opened.round_id is not None and opened.answer is None
    request = InputRequest.objects.get(round_id=opened.round_id)
    return {"alice": alice, "agent": agent, "call": call, "request": request}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ending", ["finished", "failed"])
def test_a_held_call_ending_as_its_agent_cancels_it_neither_deadlocks(
    held_question: dict[str, Any], monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    call, ir = held_question["call"], held_question["request"]

    def end() -> Any:
        if ending == "finished":
            error = PermanentError("connect_failed", "the session ended")
            return holding.held_finish(call_id=call.pk, error=error, sent=True)
        return holding.held_failed(call_id=call.pk, holder_id=call.holder_id, why="it crashed")

    errors = race(
        monkeypatch,
        gates,
        "gate_withdraw_lock",  # the cancel holds the open round, and comes for the call next
        lambda: calls.call_cancel(agent=held_question["agent"], call_id=call.pk),
        end,
    )
    assert errors == {}
    ended = ToolCall.objects.get(pk=call.pk)
    assert ended.status == ToolCall.Status.CANCELLED  # the cancel came first; the holder's end found it so
    assert Round.objects.get(pk=ir.round_id).status == Round.Status.CLOSED
