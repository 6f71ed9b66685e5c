"""An idempotency_key repeats its own request and nothing else (docs/api.md: POST /api/v1/calls, relays)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from approvals.models import InputRequest, McpServer, Membership, Round, RoutingRule, ToolCall
from approvals.services import gate_decisions
from tests import factories
from tests.hub import Agent

pytestmark = pytest.mark.django_db

ASK = {
    "method": "elicitation/create",
    "params": {"mode": "form", "message": "OK?", "requestedSchema": {"type": "object", "properties": {}}},
}


@pytest.fixture
def agent() -> Agent:
    servers = [factories.server("deploy"), factories.server("payments")]
    _, token = factories.agent("ci-bot", servers=servers)
    return Agent(token)


def _refused(response: Any) -> dict[str, Any]:
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["fields"] == {"idempotency_key": "already used for another request"}
    return error


FIRST = {"server": "deploy", "tool": "create_deployment", "arguments": {"branch": "main", "n": 1}}


@pytest.mark.parametrize(
    "other",
    [
        {"arguments": {"branch": "release", "n": 1}},
        {"arguments": {"branch": "main", "n": True}},  # JSON's true is not 1
        {"arguments": {}},
        {"tool": "delete_deployment"},
        {"server": "payments"},
    ],
    ids=["arguments", "true-is-not-1", "no-arguments", "tool", "server"],
)
def test_a_key_given_with_another_call_is_refused_not_answered_with_the_first(
    agent: Agent, other: dict[str, Any]
) -> None:
    first = agent.post("/calls", {**FIRST, "idempotency_key": "k-1"})
    assert first.status_code == 202
    error = _refused(agent.post("/calls", {**FIRST, **other, "idempotency_key": "k-1"}))
    said = "create_deployment of deploy" + (" with other arguments" if list(other) == ["arguments"] else ";")
    assert said in error["message"]
    assert ToolCall.objects.count() == 1


def test_the_same_call_again_with_its_key_still_repeats_it(agent: Agent) -> None:
    first = agent.post("/calls", {**FIRST, "idempotency_key": "k-1"})
    # The same arguments in another order are the same request.
    again = agent.post("/calls", {**FIRST, "arguments": {"n": 1, "branch": "main"}, "idempotency_key": "k-1"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json() == again.json()


def test_a_relay_key_given_with_another_relay_is_refused(agent: Agent) -> None:
    relay = {**FIRST, "input_requests": {"ok": ASK}, "idempotency_key": "r-1"}
    first = agent.post("/relays", relay)
    assert first.status_code == 201
    assert agent.post("/relays", relay).json()["id"] == first.json()["id"]
    _refused(agent.post("/relays", {**relay, "tool": "other_tool"}))
    _refused(agent.post("/relays", {**relay, "server": "an unregistered label"}))
    assert ToolCall.objects.count() == 1


def test_the_asked_arguments_repeat_a_call_a_reviewer_edited_at_its_gate(agent: Agent) -> None:
    """The call's arguments are the approved ones after an edit; the agent repeats the ones it asked."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.get(slug="deploy")
    server.tools = [
        {
            "name": "create_deployment",
            "inputSchema": {"type": "object", "properties": {"branch": {"type": "string"}, "n": {}}},
        }
    ]
    server.tools_fetched_at = timezone.now()
    server.save()
    RoutingRule.objects.create(name="all", server=server, tool_pattern="*", gate=True, team=release)
    first = agent.post("/calls", {**FIRST, "idempotency_key": "k-1"})
    assert first.status_code == 202
    gate = InputRequest.objects.get(round__call_id=first.json()["id"], round__kind=Round.Kind.GATE)
    gate_decisions.gate_decide(
        input_request_id=gate.pk, user=alice, decision="edit", arguments={"branch": "hotfix", "n": 1}
    )
    assert ToolCall.objects.get(pk=first.json()["id"]).arguments == {"branch": "hotfix", "n": 1}
    again = agent.post("/calls", {**FIRST, "idempotency_key": "k-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    _refused(agent.post("/calls", {**FIRST, "arguments": {"branch": "other"}, "idempotency_key": "k-1"}))


def test_a_key_given_for_another_person_is_refused_not_answered_with_their_call(db: None) -> None:
    """Whom a call acts for decides who may open its links and whose grants apply: the same call for someone
    else is another request, not a repeat of the first person's."""
    alice, bob = factories.user("alice"), factories.user("bob")
    client, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    client.acts_for_users.set([alice, bob])
    agent = Agent(token)
    first = agent.post("/calls", {**FIRST, "on_behalf_of": "alice", "idempotency_key": "k-1"})
    assert first.status_code == 202
    again = agent.post("/calls", {**FIRST, "on_behalf_of": "alice", "idempotency_key": "k-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    error = _refused(agent.post("/calls", {**FIRST, "on_behalf_of": "bob", "idempotency_key": "k-1"}))
    assert "for another person" in error["message"] and "alice" not in error["message"]
    _refused(agent.post("/calls", {**FIRST, "idempotency_key": "k-1"}))
    # And the other way: a call for no one, repeated for someone.
    agent.post("/calls", {**FIRST, "idempotency_key": "k-2"})
    error = _refused(agent.post("/calls", {**FIRST, "on_behalf_of": "bob", "idempotency_key": "k-2"}))
    assert "for no one in particular" in error["message"]
    relay = {**FIRST, "input_requests": {"ok": ASK}, "on_behalf_of": "alice", "idempotency_key": "r-1"}
    assert agent.post("/relays", relay).status_code == 201
    _refused(agent.post("/relays", {**relay, "on_behalf_of": "bob"}))
    assert ToolCall.objects.count() == 3
