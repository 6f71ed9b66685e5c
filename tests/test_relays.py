"""Relay mode: the agent is the MCP client and hands the hub only its input requests."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import tasks
from approvals.models import AuditEvent, InputRequest, Round, ToolCall
from tests.hub import Hub, WebhookReceiver, set_up_hub

pytestmark = pytest.mark.timeout(120)

ENV_REQUEST = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Which environment?",
        "requestedSchema": {
            "type": "object",
            "properties": {"environment": {"type": "string", "enum": ["staging", "production"]}},
            "required": ["environment"],
        },
    },
}
URL_REQUEST = {
    "method": "elicitation/create",
    "params": {"mode": "url", "message": "Sign in to continue", "url": "https://auth.example.com/start"},
}


@pytest.fixture
def hub(worker) -> Hub:
    return set_up_hub("http://127.0.0.1:9/mcp")


def relay(hub: Hub, **extra) -> str:
    body = {
        "server": "demo",
        "tool": "create_deployment",
        "arguments": {"branch": "main"},
        "input_requests": {"environment": ENV_REQUEST, "login": URL_REQUEST},
        **extra,
    }
    response = hub.agent.post("/relays", body)
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "awaiting_input"
    return response.json()["id"]


def test_answers_go_back_to_the_agent_by_webhook_and_long_poll(hub: Hub) -> None:
    with WebhookReceiver() as hook:
        relay_id = relay(hub, callback_url=hook.url)
        assert hub.agent.get(f"/relays/{relay_id}").json()["input_responses"] is None
        items = {i["key"]: i for i in hub.reviewer.inbox() if i["call"] == relay_id}
        assert set(items) == {"environment", "login"}
        hub.reviewer.respond(items["environment"]["id"], "accept", {"environment": "production"})
        assert hub.agent.get(f"/relays/{relay_id}").json()["status"] == "awaiting_input"
        hub.reviewer.respond(items["login"]["id"], "accept")
        body = hub.agent.get(f"/relays/{relay_id}", wait=10).json()
        assert body["status"] == "answered"
        assert body["input_responses"] == {
            "environment": {"action": "accept", "content": {"environment": "production"}},
            "login": {"action": "accept"},
        }
        delivered = hook.wait_for("relay.answered").json()
        assert delivered["data"]["input_responses"] == body["input_responses"]
    assert not Round.objects.filter(call_id=relay_id).exclude(status=Round.Status.CLOSED).exists()


def test_a_relay_that_expires_answers_cancel_for_what_is_left(hub: Hub) -> None:
    with WebhookReceiver() as hook:
        relay_id = relay(hub, callback_url=hook.url, expires_in=60)
        login = next(i for i in hub.reviewer.inbox() if i["key"] == "login")
        hub.reviewer.respond(login["id"], "decline", reason="not me")
        Round.objects.filter(call_id=relay_id).update(deadline=timezone.now() - timedelta(seconds=1))
        assert tasks.expire_stale() == 1
        body = hub.agent.get(f"/relays/{relay_id}").json()
        assert body["status"] == "expired"
        assert body["input_responses"] == {
            "environment": {"action": "cancel"},
            "login": {"action": "decline"},
        }
        hook.wait_for("relay.expired")


def test_a_relay_for_an_unregistered_server_keeps_the_agents_label(hub: Hub) -> None:
    relay_id = relay(hub, server="someone-elses-mcp")
    call = ToolCall.objects.get(pk=relay_id)
    assert call.server is None and call.server_name == "someone-elses-mcp"
    # Unrouted requests go to staff, not to a team.
    assert InputRequest.objects.filter(round__call=call, team__isnull=True).count() == 2


def test_the_agent_can_cancel_a_relay(hub: Hub) -> None:
    relay_id = relay(hub)
    response = hub.agent.post(f"/relays/{relay_id}/cancel", {})
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert hub.reviewer.inbox() == []
    cancelled = AuditEvent.objects.get(call_id=relay_id, verb="call.cancelled")
    assert (cancelled.actor_type, cancelled.actor_label) == ("agent", "ci-agent")
    again = hub.agent.post(f"/relays/{relay_id}/cancel", {})
    assert again.status_code == 409


def test_malformed_input_requests_are_refused(hub: Hub) -> None:
    response = hub.agent.post("/relays", {"server": "demo", "tool": "t", "input_requests": {"a": "nope"}})
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"a": "must be an object with method and params"}
    assert not ToolCall.objects.exists()


def test_a_schema_outside_the_spec_is_never_shown_and_answered_decline(hub: Hub) -> None:
    nested = {
        "method": "elicitation/create",
        "params": {
            "message": "Address?",
            "requestedSchema": {
                "type": "object",
                "properties": {"address": {"type": "object", "properties": {"city": {"type": "string"}}}},
            },
        },
    }
    response = hub.agent.post(
        "/relays", {"server": "demo", "tool": "t", "input_requests": {"address": nested}}
    )
    relay_id = response.json()["id"]
    body = hub.agent.get(f"/relays/{relay_id}").json()
    assert body["status"] == "answered"
    assert body["input_responses"] == {"address": {"action": "decline"}}
    problem = body["rounds"][0]["input_requests"][0]["problem"]
    assert problem.startswith("Not shown to reviewers") and "address" in problem
    assert hub.reviewer.inbox() == []


def test_credential_fields_are_flagged_to_reviewers(hub: Hub) -> None:
    secret = {
        "method": "elicitation/create",
        "params": {
            "message": "Paste your key",
            "requestedSchema": {"type": "object", "properties": {"api_key": {"type": "string"}}},
        },
    }
    hub.agent.post("/relays", {"server": "demo", "tool": "t", "input_requests": {"key": secret}})
    (item,) = hub.reviewer.inbox()
    assert item["flags"] == ["sensitive_fields"]


def test_form_fields_keep_the_servers_order(hub: Hub) -> None:
    # PostgreSQL's jsonb sorts object keys; reviewers must still see the fields as the server ordered them.
    order = ["zone", "approver_email", "a", "middle_name"]
    schema = {"type": "object", "properties": {key: {"type": "string"} for key in order}}
    request = {"method": "elicitation/create", "params": {"message": "Fill in", "requestedSchema": schema}}
    hub.agent.post("/relays", {"server": "demo", "tool": "t", "input_requests": {"form": request}})
    (item,) = hub.reviewer.inbox()
    assert list(item["requested_schema"]["properties"]) == order
