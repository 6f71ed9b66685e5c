"""The agent-facing API as a third-party client meets it: addresses, idempotency, answers and webhooks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from approvals.models import InputRequest, Membership, ToolCall, WebhookDelivery
from approvals.services import tokens
from tests import factories
from tests.hub import off_the_loop

pytestmark = pytest.mark.django_db

ASK = {
    "method": "elicitation/create",
    "params": {"mode": "form", "message": "Which?", "requestedSchema": factories.ENVIRONMENT_SCHEMA},
}


class Api:
    def __init__(self, token: str) -> None:
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)

    def post(self, path: str, body: Any, **headers: str) -> Any:
        raw = json.dumps(body)
        extra = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
        return off_the_loop(self.client.post, f"/api/v1{path}", raw, content_type="application/json", **extra)


@pytest.fixture
def agent() -> Api:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    return Api(token)


CALL = {"server": "deploy", "tool": "create_deployment", "arguments": {"branch": "main"}}
RELAY = {"server": "deploy", "tool": "t", "input_requests": {"environment": ASK}}


def test_a_new_call_and_a_new_relay_carry_their_address_in_location(agent: Api) -> None:
    """RFC 9110: a 201 (and a 202 that made something) names what it made; a client that follows
    `Location` finds the same address as the body's `url`. A repeat (200) made nothing."""
    created = agent.post("/calls", {**CALL, "idempotency_key": "k-1"})
    assert created.status_code == 202, created.content
    assert created["Location"] == created.json()["url"] == f"/api/v1/calls/{created.json()['id']}"
    repeat = agent.post("/calls", {**CALL, "idempotency_key": "k-1"})
    assert repeat.status_code == 200 and not repeat.has_header("Location")
    relay = agent.post("/relays", RELAY)
    assert relay.status_code == 201, relay.content
    assert relay["Location"] == relay.json()["url"] == f"/api/v1/relays/{relay.json()['id']}"


@pytest.mark.parametrize("path, body", [("/calls", CALL), ("/relays", RELAY)], ids=["call", "relay"])
def test_the_idempotency_key_header_repeats_a_request_as_the_body_field_does(
    agent: Api, path: str, body: dict
) -> None:
    """A client that sends the usual `Idempotency-Key` header on its retry gets the first call back, not a
    second execution of the tool."""
    first = agent.post(path, body, **{"Idempotency-Key": " deploy-42 "})
    assert first.status_code in (201, 202), first.content
    again = agent.post(path, body, **{"Idempotency-Key": "deploy-42"})
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert ToolCall.objects.count() == 1
    assert ToolCall.objects.get().idempotency_key == "deploy-42"
    # The body's field and the header name the same key.
    same = agent.post(path, {**body, "idempotency_key": "deploy-42"})
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
    # Another request under the key is refused as with the body's field.
    other = agent.post(path, {**body, "arguments": {"branch": "dev"}}, **{"Idempotency-Key": "deploy-42"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"


def test_the_body_s_key_wins_over_the_header_and_a_header_too_long_is_a_400(agent: Api) -> None:
    """The body's `idempotency_key` is the contract's: a header an HTTP library adds of its own changes
    nothing for a client that sends it."""
    first = agent.post("/calls", {**CALL, "idempotency_key": "a"}, **{"Idempotency-Key": "b"})
    second = agent.post("/calls", {**CALL, "idempotency_key": "a"}, **{"Idempotency-Key": "c"})
    assert (first.status_code, second.status_code) == (202, 200)
    assert second.json()["id"] == first.json()["id"]
    assert list(ToolCall.objects.values_list("idempotency_key", flat=True)) == ["a"]
    long = agent.post("/calls", CALL, **{"Idempotency-Key": "k" * 201})
    assert long.status_code == 400, long.content
    error = long.json()["error"]
    assert error["code"] == "invalid_body"
    assert error["fields"] == {"Idempotency-Key": "at most 200 characters"}
    assert ToolCall.objects.count() == 1


def test_a_cancelled_relay_s_webhook_names_a_relay(agent: Api, settings: Any) -> None:
    """A webhook's type says which address to read: `call.*` sends a receiver to /calls/<id>, which answers
    404 for a relay."""
    settings.ELICIT_WEBHOOK_ALLOW_HTTP = True
    relay = agent.post("/relays", {**RELAY, "callback_url": "http://127.0.0.1:9/hook"}).json()
    call = agent.post("/calls", {**CALL, "callback_url": "http://127.0.0.1:9/hook"}).json()
    assert agent.post(f"/relays/{relay['id']}/cancel", {}).status_code == 200
    assert agent.post(f"/calls/{call['id']}/cancel", {}).status_code == 200
    relay_hook = WebhookDelivery.objects.get(call_id=relay["id"])
    assert relay_hook.event_type == relay_hook.payload["type"] == "relay.cancelled"
    assert (
        relay_hook.payload["data"]["status"] == "cancelled"
        and "input_responses" in relay_hook.payload["data"]
    )
    assert WebhookDelivery.objects.get(call_id=call["id"]).event_type == "call.cancelled"


def test_a_second_cancel_of_a_relay_speaks_of_a_relay(agent: Api) -> None:
    relay = agent.post("/relays", RELAY).json()
    agent.post(f"/relays/{relay['id']}/cancel", {})
    again = agent.post(f"/relays/{relay['id']}/cancel", {})
    assert again.status_code == 409
    assert again.json()["error"] == {"code": "already_final", "message": "The relay is already cancelled."}


def test_one_approval_of_two_answers_pending_with_a_null_action() -> None:
    """The answer to respond is the request as it stands; with one approval of two it is still pending and
    has no action yet: null, as the call's JSON says it, not an empty string."""
    server = factories.server("deploy")
    ag, _ = factories.agent("ci-bot", servers=[server])
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    rnd = factories.open_round(factories.call(server, ag), team_=release)
    InputRequest.objects.filter(round=rnd).update(approvals_required=2)
    ir = InputRequest.objects.get(round=rnd)
    _, token = tokens.personal_token_create(user=alice)
    body = {"action": "accept", "content": {"environment": "staging"}}
    response = Api(token).post(f"/input-requests/{ir.pk}/respond", body)
    assert response.status_code == 200, response.content
    assert response.json() == {"id": str(ir.pk), "status": "pending", "action": None}


def test_a_relay_s_key_given_for_a_call_names_the_field_as_any_reused_key_does(agent: Api) -> None:
    """docs/api.md: a reused key is a 409 with `fields: {"idempotency_key": ...}`, whatever made it."""
    assert agent.post("/relays", {**RELAY, "idempotency_key": "k-9"}).status_code == 201
    reused = agent.post("/calls", {**CALL, "idempotency_key": "k-9"})
    assert reused.status_code == 409, reused.content
    error = reused.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["fields"] == {"idempotency_key": "already used for another request"}


@pytest.mark.parametrize("label", ["Vault", "VAULT", " vault ", "Secrets vault", "secrets VAULT"])
def test_a_relay_cannot_pass_itself_off_as_a_server_the_agent_may_not_use(agent: Api, label: str) -> None:
    """The inbox shows a relay's label as its server's name: a label that reads as a registered server's slug
    or name would show the agent's questions as that server's to reviewers and their bots."""
    factories.server("vault", name="Secrets vault")
    refused = agent.post("/relays", {**RELAY, "server": label})
    assert refused.status_code == 403, refused.content
    assert refused.json()["error"]["code"] == "server_not_allowed"
    assert not ToolCall.objects.exists()
    # A label of its own, and a server the agent may use under another spelling, stay labels.
    for own in ("vault-proxy", "Deploy", "Deploy server"):
        created = agent.post("/relays", {**RELAY, "server": own})
        assert created.status_code == 201, created.content
