"""What an agent's webhook carries: ``data`` is the body ``GET /api/v1/calls/<id>`` answers once the call has
ended, whatever else the transaction that ended it changed after the call's own row (a send's answer ends
the call first, for its lock, then closes the round it answered). The receiver is a real loopback listener."""

from __future__ import annotations

import json

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals.models import AgentClient, Round, ToolCall, WebhookAttempt, WebhookDelivery
from approvals.services import calls, tokens, webhooks
from tests import factories
from tests.hub import WebhookReceiver


@pytest.fixture(autouse=True)
def attempts_made_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attempt is made by the test itself: a delivery's task is not queued, so a Celery worker that
    another test left running cannot make the attempt first."""
    monkeypatch.setattr(webhooks, "enqueue_on_commit", lambda *args, **kwargs: None)


@pytest.mark.django_db(transaction=True)
def test_a_webhook_carries_the_call_as_its_get_answers_once_the_call_ended() -> None:
    server = factories.server("deploy")
    agent, token = tokens.agent_create(name="deployer", servers=[server], with_webhook_secret=True)
    with WebhookReceiver() as receiver:
        call = factories.call(server, agent, callback_url=receiver.url)
        rnd = factories.open_round(call)
        rnd.input_requests.update(
            status="answered", action="accept", content={"environment": "staging"}, answered_at=timezone.now()
        )
        Round.objects.filter(pk=rnd.pk).update(status=Round.Status.SENDING, outcome=Round.Outcome.ANSWERED)
        ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.RESUMING)
        with transaction.atomic():
            # As a send applies the server's result: the call's end (its lock) first, then the round closed.
            ended = ToolCall.objects.select_related("server", "agent").get(pk=call.pk)
            calls.call_finish(
                call=ended,
                status=ToolCall.Status.COMPLETED,
                result={"content": [{"type": "text", "text": "deployed"}], "isError": False},
                only_from=ToolCall.Status.sending(),
            )
            Round.objects.filter(pk=rnd.pk).update(status=Round.Status.CLOSED, closed_at=ended.finished_at)
        (delivery,) = WebhookDelivery.objects.filter(call=call)

        assert webhooks.webhook_attempt(delivery_id=str(delivery.pk)) is None

    answered = Client().get(f"/api/v1/calls/{call.pk}", headers={"authorization": f"Bearer {token}"})
    assert answered.status_code == 200
    (received,) = receiver.received
    body = received.json()
    assert body["type"] == "call.completed"
    assert body["data"]["rounds"][0]["closed_at"] is not None
    assert body["data"] == answered.json()
    delivery.refresh_from_db()
    assert delivery.payload == body and json.loads(received.body) == delivery.payload


@pytest.mark.django_db(transaction=True)
def test_a_deactivated_agent_s_callback_gets_no_more_results() -> None:
    """Deactivating an agent (a leaked token, a retired bot) stops what it is sent, as the gateway withholds
    a result from an agent deactivated while it waits: its pending webhooks are given up unsent."""
    server = factories.server("deploy")
    agent, _ = tokens.agent_create(name="deployer", servers=[server], with_webhook_secret=True)
    with WebhookReceiver(statuses=(500, 200)) as receiver:
        call = factories.call(server, agent, callback_url=receiver.url)
        factories.finish_call(call.pk)
        (delivery,) = WebhookDelivery.objects.filter(call=call)
        # Tried once, its retry due (in up to 2 s, jittered down to half of it).
        assert 1.0 <= (webhooks.webhook_attempt(delivery_id=str(delivery.pk)) or 0) <= 2.0
        AgentClient.objects.filter(pk=agent.pk).update(is_active=False)

        assert webhooks.webhook_attempt(delivery_id=str(delivery.pk)) is None

    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED
    last = WebhookAttempt.objects.filter(delivery=delivery).order_by("number").last()
    assert last is not None and last.status_code is None
    assert last.error == "not sent: the agent is deactivated"
