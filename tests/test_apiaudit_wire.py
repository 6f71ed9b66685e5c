"""The agent API over the wire (Daphne, httpx), as a third-party agent meets it: the `Idempotency-Key`
header, `Location`, a relay's long-poll, and the signed webhooks of a relay answered and one cancelled."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import httpx
import pytest

from approvals.models import McpServer, Membership, ToolCall
from approvals.services import tokens
from tests import factories
from tests.hub import WebhookReceiver

pytestmark = pytest.mark.timeout(120)

ASK = {
    "method": "elicitation/create",
    "params": {"mode": "form", "message": "Which?", "requestedSchema": factories.ENVIRONMENT_SCHEMA},
}


def signed(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks' check, written from its specification."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    message = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()
    return expected in headers.get("webhook-signature", "").split(" ")


def test_a_relay_over_the_wire_from_header_key_to_signed_webhooks(web, worker) -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy", name="Deploy", url="http://127.0.0.1:9/mcp", default_team=release
    )
    agent, agent_token = tokens.agent_create(name="ci-bot", servers=[server], with_webhook_secret=True)
    _, reviewer_token = tokens.personal_token_create(user=alice)
    api = httpx.Client(
        base_url=web.url + "/api/v1", headers={"Authorization": f"Bearer {agent_token}"}, timeout=60
    )
    reviewer = httpx.Client(
        base_url=web.url + "/api/v1", headers={"Authorization": f"Bearer {reviewer_token}"}
    )
    with WebhookReceiver() as hook, api, reviewer:
        body = {
            "server": "deploy",
            "tool": "t",
            "input_requests": {"environment": ASK},
            "callback_url": hook.url,
        }
        first = api.post("/relays", json=body, headers={"Idempotency-Key": "relay-1"})
        assert first.status_code == 201, first.text
        relay_id = first.json()["id"]
        assert first.headers["Location"] == f"/api/v1/relays/{relay_id}"
        again = api.post("/relays", json=body, headers={"Idempotency-Key": "relay-1"})
        assert (again.status_code, again.json()["id"]) == (200, relay_id)
        assert ToolCall.objects.filter(kind=ToolCall.Kind.RELAY).count() == 1

        (item,) = [i for i in reviewer.get("/inbox").json() if i["call"] == relay_id]
        answer = {"action": "accept", "content": {"environment": "staging"}}
        assert reviewer.post(f"/input-requests/{item['id']}/respond", json=answer).status_code == 200
        started = time.monotonic()
        polled = api.get(f"/relays/{relay_id}", params={"wait": 30}).json()
        assert time.monotonic() - started < 15
        assert polled["status"] == "answered"
        assert polled["input_responses"] == {
            "environment": {"action": "accept", "content": {"environment": "staging"}}
        }
        answered = hook.wait_for("relay.answered")
        assert signed(agent.webhook_secret, answered.headers, answered.body)
        assert answered.json()["data"]["input_responses"] == polled["input_responses"]

        second = api.post("/relays", json={**body, "idempotency_key": "relay-2"})
        assert second.status_code == 201, second.text
        second_id = second.json()["id"]
        assert api.post(f"/relays/{second_id}/cancel").status_code == 200
        cancelled = hook.wait_for("relay.cancelled")
        assert signed(agent.webhook_secret, cancelled.headers, cancelled.body)
        data = cancelled.json()["data"]
        assert (data["id"], data["status"]) == (second_id, "cancelled")
        # The type names the address to read it at.
        assert api.get(f"/relays/{second_id}").json()["status"] == "cancelled"
        assert not [r for r in hook.received if r.json()["type"].startswith("call.")]
