"""The whole loop on real parts: API, PostgreSQL, Redis, a Celery worker, the demo MCP server over HTTP."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import tasks
from approvals.models import AuditEvent, InputRequest, Round, ToolCall, WebhookAttempt
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import Hub, WebhookReceiver, set_up_hub

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def hub(worker, demo_server) -> Hub:
    demo_support.reset(demo_server.url)
    return set_up_hub(demo_server.url)


def signature_is_valid(secret: str, headers: dict[str, str], body: bytes) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return f"v1,{expected}" in headers["webhook-signature"].split(" ")


def test_production_deploy_takes_two_rounds_and_the_agent_gets_a_signed_webhook(
    hub: Hub, demo_server
) -> None:
    with WebhookReceiver() as hook:
        call_id = hub.agent.call("create_deployment", {"branch": "main"}, callback_url=hook.url)

        environment = hub.reviewer.wait_for_request(call_id, "environment")
        assert environment["server_name"] == "Deploy bot"
        assert environment["arguments"] == {"branch": "main"}
        assert (
            hub.reviewer.respond(environment["id"], "accept", {"environment": "production"}).status_code
            == 200
        )

        confirm = hub.reviewer.wait_for_request(call_id, "confirm")
        assert (
            hub.reviewer.respond(
                confirm["id"], "accept", {"confirm": True, "reason": "release 2.3"}
            ).status_code
            == 200
        )

        body = hub.agent.wait(call_id)
        assert body["status"] == "completed", body
        assert [r["number"] for r in body["rounds"]] == [1, 2]
        assert all(r["closed_at"] for r in body["rounds"])
        assert body["result"]["isError"] is False
        assert "production" in body["result"]["content"][0]["text"]

        delivered = hook.wait_for("call.completed")
        assert signature_is_valid(hub.agent_secret, delivered.headers, delivered.body)
        assert delivered.json()["data"]["id"] == call_id
        assert delivered.json()["data"]["status"] == "completed"
        assert delivered.json()["data"]["result"] == body["result"]

    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    retries = [
        r
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    assert [list(r["body"]["params"]["inputResponses"]) for r in retries] == [["environment"], ["confirm"]]
    assert retries[1]["body"]["params"]["inputResponses"]["confirm"] == {
        "action": "accept",
        "content": {"confirm": True, "reason": "release 2.3"},
    }
    # Each retry carries the Idempotency-Key of its round.
    assert [r["headers"]["idempotency-key"] for r in retries] == [
        f"elicit-{call_id}-r1",
        f"elicit-{call_id}-r2",
    ]


def test_the_retry_echoes_request_state_byte_for_byte(hub: Hub, demo_server) -> None:
    call_id = hub.agent.call("create_deployment", {"branch": "feature/x"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    stored = Round.objects.get(call_id=call_id, number=1).request_state
    assert stored
    hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    assert hub.agent.wait(call_id)["status"] == "completed"
    sent = [
        r["body"]["params"]
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    assert sent[0]["requestState"] == stored


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_decline_and_cancel_reach_the_server_and_its_answer_reaches_the_agent(
    hub: Hub, demo_server, action
) -> None:
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    assert (
        hub.reviewer.respond(
            item["id"], action, reason="not today" if action == "decline" else ""
        ).status_code
        == 200
    )
    body = hub.agent.wait(call_id)
    assert body["status"] == "completed"
    assert body["result"]["isError"] is True
    sent = [
        r["body"]["params"]["inputResponses"]
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    assert sent == [{"environment": {"action": action}}]
    assert demo_support.executions(demo_server.url).get("create_deployment", 0) == 0


def test_an_expired_round_is_resumed_with_cancel(hub: Hub, demo_server) -> None:
    with WebhookReceiver() as hook:
        call_id = hub.agent.call("create_deployment", {"branch": "main"}, callback_url=hook.url)
        hub.reviewer.wait_for_request(call_id, "environment")
        # Time travel: the round's deadline is now in the past; beat's task runs as it would every 15 s.
        Round.objects.filter(call_id=call_id).update(deadline=timezone.now() - timedelta(seconds=1))
        assert tasks.expire_stale() == 1
        body = hub.agent.wait(call_id)
        assert body["status"] == "expired"
        assert body["rounds"][0]["input_requests"][0]["status"] == "expired"
        assert body["rounds"][0]["input_requests"][0]["action"] == "cancel"
        assert body["result"]["isError"] is True
        hook.wait_for("call.expired")
    sent = [
        r["body"]["params"]["inputResponses"]
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    assert sent == [{"environment": {"action": "cancel"}}]
    assert hub.reviewer.inbox() == []


def test_an_expired_round_can_be_abandoned_instead(hub: Hub, demo_server) -> None:
    hub.server.on_expiry = "abandon"
    hub.server.save()
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    hub.reviewer.wait_for_request(call_id, "environment")
    Round.objects.filter(call_id=call_id).update(deadline=timezone.now() - timedelta(seconds=1))
    assert tasks.expire_stale() == 1
    body = hub.agent.wait(call_id)
    assert body["status"] == "expired"
    assert body["error"]["code"] == "expired"
    retries = [
        r
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    assert retries == []


def test_url_mode_accept_goes_back_without_content(hub: Hub, demo_server) -> None:
    call_id = hub.agent.call("connect_account", {"service": "github"})
    item = next(i for i in _wait_items(hub, call_id))
    assert item["mode"] == "url" and item["url"].startswith("https://")
    assert "requested_schema" not in item
    hub.reviewer.respond(item["id"], "accept")
    body = hub.agent.wait(call_id)
    assert body["status"] == "completed" and body["result"]["isError"] is False


def _wait_items(hub: Hub, call_id: str) -> list[dict]:
    from tests.live import wait_until

    return wait_until(lambda: [i for i in hub.reviewer.inbox() if i["call"] == call_id], 30, 0.1)  # type: ignore[return-value]


def test_plain_and_failing_tools_complete_without_a_round(hub: Hub) -> None:
    echo = hub.agent.wait(hub.agent.call("echo", {"text": "hi"}))
    assert echo["status"] == "completed" and echo["rounds"] == []
    assert echo["result"]["content"][0]["text"] == "hi"
    failing = hub.agent.wait(hub.agent.call("fail"))
    assert failing["status"] == "completed" and failing["result"]["isError"] is True


def test_an_unreachable_server_fails_the_call_after_bounded_retries(hub: Hub) -> None:
    hub.server.url = "http://127.0.0.1:9/mcp"  # nothing listens on the discard port
    hub.server.save()
    call_id = hub.agent.call("echo", {"text": "hi"})
    body = hub.agent.wait(call_id, 60)
    assert body["status"] == "failed", body
    assert body["error"]["code"] == "connect_failed"
    assert "gave up after" in body["error"]["message"]
    retries = int(WORKER_ENV["ELICIT_MCP_MAX_RETRIES"])
    assert ToolCall.objects.get(pk=call_id).attempts == retries + 1
    assert AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").count() == retries


def test_webhooks_are_retried_and_every_attempt_recorded(hub: Hub) -> None:
    with WebhookReceiver(fail_first=2) as hook:
        call_id = hub.agent.call("echo", {"text": "hi"}, callback_url=hook.url)
        hub.agent.wait(call_id)
        from tests.live import wait_until

        wait_until(lambda: len(hook.received) >= 3, 30, what="three webhook attempts")
    attempts = list(WebhookAttempt.objects.filter(delivery__call_id=call_id).order_by("number"))
    assert [a.status_code for a in attempts] == [500, 500, 204]
    assert len({r.headers["webhook-id"] for r in hook.received}) == 1  # the same message, retried


def test_inputs_answered_by_the_api_are_audited(hub: Hub) -> None:
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    hub.agent.wait(call_id)
    verbs = list(AuditEvent.objects.filter(call_id=call_id).order_by("id").values_list("verb", flat=True))
    assert verbs[0] == "call.submitted"
    for verb in ["round.opened", "input.requested", "input.answered", "round.answered", "call.completed"]:
        assert verb in verbs
    answered = AuditEvent.objects.get(call_id=call_id, verb="input.answered")
    assert answered.actor_label == "alice"
    assert answered.data["content"] == {"environment": "staging"}
    assert InputRequest.objects.get(pk=item["id"]).answered_by == hub.reviewer_user
