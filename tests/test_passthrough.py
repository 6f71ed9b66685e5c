"""Routing to the requester, on PostgreSQL: which questions a "requester answers" rule passes through to the
agent's own MCP client, that reviewers never get them, and how the agent's answer is recorded."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals import permissions
from approvals.models import AuditEvent, InputRequest, Membership, Notification, Round, RoutingRule, ToolCall
from approvals.services import answers
from approvals.services.errors import AnswerInvalid, Conflict, Forbidden, NotFound
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
URL = {
    "method": "elicitation/create",
    "params": {"mode": "url", "message": "Sign in", "url": "https://accounts.example.com/sign-in?x=1"},
}
MODERN_FORM = {"era": "2026-07-28", "modes": ["form"]}


@pytest.fixture
def world() -> dict[str, Any]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    release.chat_webhook_url = "https://chat.example.com/hook"
    release.save()
    server = factories.server(default_team=release)
    agent, _ = factories.agent(servers=[server])
    RoutingRule.objects.create(
        name="requester picks", server=server, team=release, answered_by=RoutingRule.AnsweredBy.REQUESTER
    )
    root = factories.user("root", is_superuser=True, is_staff=True)
    return {"alice": alice, "root": root, "server": server, "agent": agent, "team": release}


def _open(
    world: dict[str, Any], client: dict[str, Any] | None, request: dict[str, Any] = FORM
) -> InputRequest:
    call = factories.call(world["server"], world["agent"], agent_client=client)
    round_open(
        call=call,
        input_requests={"q": request},
        raw={"resultType": "input_required"},
        request_state="upstream-secret",
        received_at=timezone.now(),
    )
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.AWAITING_INPUT)  # as the sender does
    return InputRequest.objects.get(round__call=call)


def test_a_capable_clients_question_goes_to_the_requester_and_no_reviewer_sees_it(
    world: dict[str, Any],
) -> None:
    ir = _open(world, MODERN_FORM)
    assert ir.for_requester is True and ir.routing["answered_by"] == "requester"
    for user in (world["alice"], world["root"]):
        assert not permissions.answerable_input_requests(user).filter(pk=ir.pk).exists()
        assert not permissions.may_answer(permissions.scope_of(user), ir)
    assert not Notification.objects.filter(input_request=ir).exists()
    routed = AuditEvent.objects.get(verb="input.routed", input_request_id=ir.pk)
    assert routed.data["answered_by"] == "requester" and "passthrough_refused" not in routed.data
    with pytest.raises(Forbidden):
        answers.input_respond(
            input_request_id=ir.pk, user=world["alice"], action="accept", content={"environment": "staging"}
        )


@pytest.mark.parametrize(
    ("client", "request_", "why"),
    [
        (None, FORM, "did not come through /mcp"),
        ({"era": "handshake", "modes": []}, FORM, "did not declare the elicitation capability"),
        (MODERN_FORM, URL, "did not declare elicitation in url mode"),
    ],
)
def test_otherwise_the_team_answers_and_the_routing_says_why(
    world: dict[str, Any], client: dict[str, Any] | None, request_: dict[str, Any], why: str
) -> None:
    ir = _open(world, client, request_)
    assert ir.for_requester is False and ir.team == world["team"]
    assert why in ir.routing["passthrough_refused"]
    routed = AuditEvent.objects.get(verb="input.routed", input_request_id=ir.pk)
    assert routed.data["answered_by"] == "team" and why in routed.data["passthrough_refused"]
    assert Notification.objects.filter(input_request=ir).exists()
    assert permissions.answerable_input_requests(world["alice"]).filter(pk=ir.pk).exists()


def test_a_team_rule_never_passes_through(world: dict[str, Any]) -> None:
    RoutingRule.objects.update(answered_by=RoutingRule.AnsweredBy.TEAM)
    ir = _open(world, MODERN_FORM)
    assert ir.for_requester is False and "passthrough_refused" not in ir.routing


def test_the_agents_answer_is_validated_recorded_once_and_audited(world: dict[str, Any]) -> None:
    agent = world["agent"]
    agent.owner = world["alice"]
    agent.save()
    ir = _open(world, MODERN_FORM)
    with pytest.raises(AnswerInvalid):
        answers.requester_respond(
            input_request_id=ir.pk, agent=agent, action="accept", content={"environment": "moon"}
        )
    other, _ = factories.agent(name="other", servers=[world["server"]])
    with pytest.raises(NotFound):
        answers.requester_respond(
            input_request_id=ir.pk, agent=other, action="accept", content={"environment": "staging"}
        )
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING

    answers.requester_respond(
        input_request_id=ir.pk, agent=agent, action="accept", content={"environment": "staging"}
    )
    # The same answer again (a client retrying after losing the response) is not an error; another is.
    answers.requester_respond(
        input_request_id=ir.pk, agent=agent, action="accept", content={"environment": "staging"}
    )
    with pytest.raises(Conflict):
        answers.requester_respond(input_request_id=ir.pk, agent=agent, action="decline")
    ir.refresh_from_db()
    assert (ir.status, ir.action, ir.content) == ("answered", "accept", {"environment": "staging"})
    assert ir.answered_by == world["alice"]  # the person the agent acts for (its owner here)
    assert ir.round.status == Round.Status.READY
    assert ToolCall.objects.get(pk=ir.round.call_id).status == ToolCall.Status.RESUMING
    answered = AuditEvent.objects.filter(verb="input.answered", input_request_id=ir.pk)
    assert answered.count() == 1
    event = answered.get()
    assert (event.actor_type, event.actor_label) == ("agent", agent.name)
    assert event.data["for"] == "alice" and event.data["answered_by"] == "requester"
    assert event.data["content"] == {"environment": "staging"}


def test_the_call_page_says_who_answers_and_why(world: dict[str, Any], client: Any) -> None:
    client.force_login(world["root"])
    passed = _open(world, MODERN_FORM)
    kept = _open(world, None)
    page = client.get(reverse("approvals:call", args=[passed.round.call_id])).content.decode()
    assert "Passed through: the requester answers through the agent" in page
    request_page = client.get(reverse("approvals:request", args=[passed.pk])).content.decode()
    assert "data-for-requester" in request_page and "data-form-body disabled" in request_page
    page = client.get(reverse("approvals:call", args=[kept.round.call_id])).content.decode()
    assert "did not come through /mcp" in page

    answers.requester_respond(
        input_request_id=passed.pk, agent=world["agent"], action="decline", content=None
    )
    page = client.get(reverse("approvals:call", args=[passed.round.call_id])).content.decode()
    assert "Decline: the requester answered through the agent" in page


def test_the_rule_form_offers_the_choice_and_refuses_it_on_a_gate(world: dict[str, Any]) -> None:
    from approvals.admin import RoutingRuleForm

    data = {
        "position": 5,
        "name": "sign-ins by the requester",
        "enabled": True,
        "tool_pattern": "*",
        "mode": "url",
        "conditions": "[]",
        "team": world["team"].pk,
        "answered_by": "requester",
    }
    form = RoutingRuleForm(data=data)
    assert form.is_valid(), form.errors
    assert form.save().answered_by == RoutingRule.AnsweredBy.REQUESTER
    gated = RoutingRuleForm(data={**data, "mode": "", "gate": True})
    assert not gated.is_valid() and "answered_by" in gated.errors
