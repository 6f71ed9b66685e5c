"""Answers that come too late, on PostgreSQL: a round's deadline refuses every answer after it, whoever gives
it, even before beat has expired the round."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import InputRequest, Membership, Round, RoutingRule, ToolCall
from approvals.services import answers
from approvals.services.errors import Conflict
from approvals.services.rounds import round_open
from tests import factories

pytestmark = pytest.mark.django_db

FORM = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Which environment?",
        "requestedSchema": factories.ENVIRONMENT_SCHEMA,
    },
}


@pytest.fixture
def agent() -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server(default_team=release)
    agent, _ = factories.agent(servers=[server])
    agent.owner = alice
    agent.save()
    RoutingRule.objects.create(
        name="requester picks", server=server, team=release, answered_by=RoutingRule.AnsweredBy.REQUESTER
    )
    return agent


def _overdue_request(agent: Any) -> InputRequest:
    """A question passed through to the agent's person, whose round's deadline has just passed (beat has not
    expired it yet)."""
    call = factories.call(agent.servers.get(), agent, agent_client={"era": "2026-07-28", "modes": ["form"]})
    round_open(
        call=call,
        input_requests={"q": FORM},
        raw={"resultType": "input_required"},
        request_state="upstream-secret",
        received_at=timezone.now(),
    )
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.AWAITING_INPUT)
    Round.objects.filter(call=call).update(deadline=timezone.now() - timedelta(seconds=1))
    ir = InputRequest.objects.get(round__call=call)
    assert ir.for_requester
    return ir


def test_the_requesters_answer_after_the_rounds_deadline_is_refused_as_too_late(agent: Any) -> None:
    ir = _overdue_request(agent)
    with pytest.raises(Conflict) as refused:
        answers.requester_respond(
            input_request_id=ir.pk, agent=agent, action="accept", content={"environment": "staging"}
        )
    assert refused.value.code == "already_answered" and "expired" in refused.value.message
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not ir.action
    assert ir.round.status == Round.Status.OPEN
    assert ToolCall.objects.get(pk=ir.round.call_id).status == ToolCall.Status.AWAITING_INPUT


def test_the_requesters_answer_repeated_after_the_deadline_is_still_not_an_error(agent: Any) -> None:
    ir = _overdue_request(agent)
    Round.objects.filter(pk=ir.round_id).update(deadline=timezone.now() + timedelta(hours=1))
    answers.requester_respond(
        input_request_id=ir.pk, agent=agent, action="accept", content={"environment": "staging"}
    )
    Round.objects.filter(pk=ir.round_id).update(deadline=timezone.now() - timedelta(seconds=1))
    again = answers.requester_respond(
        input_request_id=ir.pk, agent=agent, action="accept", content={"environment": "staging"}
    )
    assert again.status == InputRequest.Status.ANSWERED
