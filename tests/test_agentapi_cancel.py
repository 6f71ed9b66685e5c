"""Cancelling through the API: only what the address names, and only the agent's own."""

from __future__ import annotations

import pytest

from approvals.models import AuditEvent, InputRequest, ToolCall
from tests import factories
from tests.hub import Agent

pytestmark = pytest.mark.django_db

ASK = {
    "method": "elicitation/create",
    "params": {"mode": "form", "message": "OK?", "requestedSchema": {"type": "object", "properties": {}}},
}


@pytest.fixture
def agent() -> Agent:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    return Agent(token)


def _relay(agent: Agent) -> str:
    response = agent.post("/relays", {"server": "deploy", "tool": "t", "input_requests": {"ok": ASK}})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _assert_not_found(response) -> None:
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "not_found"


def test_a_relay_is_not_cancelled_through_the_calls_address(agent: Agent) -> None:
    """GET /calls/<relay id> is a 404; so is its cancel, and a 404 changes nothing."""
    relay_id = _relay(agent)
    _assert_not_found(agent.post(f"/calls/{relay_id}/cancel", {}))
    assert ToolCall.objects.get(pk=relay_id).status == ToolCall.Status.AWAITING_INPUT
    assert InputRequest.objects.get(round__call_id=relay_id).status == InputRequest.Status.PENDING
    assert not AuditEvent.objects.filter(call_id=relay_id, verb="call.cancelled").exists()
    # Through its own address it is cancelled, and the answer says so.
    response = agent.post(f"/relays/{relay_id}/cancel", {})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_a_call_is_not_cancelled_through_the_relays_address(agent: Agent) -> None:
    call_id = agent.call("t", server="deploy")
    _assert_not_found(agent.post(f"/relays/{call_id}/cancel", {}))
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.QUEUED
    response = agent.post(f"/calls/{call_id}/cancel", {})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_another_agents_call_is_not_found_and_left_alone(agent: Agent) -> None:
    call_id = agent.call("t", server="deploy")
    _, other = factories.agent("other", servers=[factories.server("other")])
    _assert_not_found(Agent(other).post(f"/calls/{call_id}/cancel", {}))
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.QUEUED


def test_cancelling_a_final_call_is_a_409(agent: Agent) -> None:
    call_id = agent.call("t", server="deploy")
    factories.finish_call(call_id)
    response = agent.post(f"/calls/{call_id}/cancel", {})
    assert response.status_code == 409 and response.json()["error"]["code"] == "already_final"
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.COMPLETED


def test_a_call_cancelled_while_it_is_being_sent_says_the_tool_may_have_run(agent: Agent) -> None:
    """A worker has claimed the call and is sending tools/call: cancelling cannot stop the server, and the
    result it sends is not kept. The cancelled call says so, as a failed call that reached a server does."""
    from approvals.services import sending

    call_id = agent.call("t", server="deploy")
    assert sending._claim(call_id) is not None  # what a worker does before it sends
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.RUNNING
    response = agent.post(f"/calls/{call_id}/cancel", {})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled"
    assert body["error"]["code"] == "cancelled_while_sending"
    assert body["error"]["tool_may_have_run"] is True
    assert "may have run" in body["error"]["message"]
    assert agent.get(f"/calls/{call_id}").json()["error"] == body["error"]
    event = AuditEvent.objects.get(call_id=call_id, verb="call.cancelled")
    assert event.data["error"]["tool_may_have_run"] is True


def test_a_call_cancelled_before_any_send_has_no_error(agent: Agent) -> None:
    call_id = agent.call("t", server="deploy")
    body = agent.post(f"/calls/{call_id}/cancel", {}).json()
    assert body["status"] == "cancelled" and body["error"] is None
