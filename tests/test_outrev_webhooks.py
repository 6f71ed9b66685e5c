"""What an agent's receiver sees of its webhooks, and what the operator reads of each attempt: a receiver
answering 500 and then 200 gets the same message again, signed anew; one answering 410 Gone is not tried
again (Standard Webhooks: the endpoint is gone), a team's chat webhook alike; a failed attempt says why.

The receivers are real loopback listeners."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import AgentClient, Notification, Team, ToolCall, WebhookAttempt, WebhookDelivery
from approvals.services import notifications, tokens, webhooks
from tests import factories
from tests.hub import WebhookReceiver
from tests.test_notifications import notices, pending_request


def _scripted(*statuses: int) -> WebhookReceiver:
    """A receiver answering each POST with the next of `statuses`, its URL carrying a token."""
    return WebhookReceiver(statuses=statuses, query="?token=receiver-secret-123")


def _delivery(url: str, *, secret: str = "") -> WebhookDelivery:
    srv = factories.server("deploy")
    agent = AgentClient.objects.create(name="deployer", token_hash="x" * 64, webhook_secret=secret)
    call = factories.call(
        srv,
        agent,
        callback_url=url,
        status=ToolCall.Status.COMPLETED,
        result={"content": [], "isError": False},
        finished_at=timezone.now() - timedelta(minutes=1),
    )
    return WebhookDelivery.objects.create(
        call=call,
        event_type="call.completed",
        url=url,
        payload={"type": "call.completed", "data": {"id": str(call.pk)}},
    )


def _verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """A receiver's check, written from the Standard Webhooks spec (not the hub's code)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(expected, sig.partition(",")[2]) for sig in headers["webhook-signature"].split()
    )


@pytest.mark.django_db(transaction=True)
def test_outrev_a_receiver_answering_500_then_200_gets_the_same_message_signed_again() -> None:
    secret = tokens.new_webhook_secret()
    with _scripted(500, 200) as receiver:
        delivery = _delivery(receiver.url, secret=secret)
        assert 1.0 <= (webhooks.webhook_attempt(delivery_id=delivery.pk) or 0) <= 2.0
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None  # a duplicate task: nothing sent

    assert len(receiver.received) == 2
    (first_headers, first_body), (headers, body) = [(r.headers, r.body) for r in receiver.received]
    assert first_headers["webhook-id"] == headers["webhook-id"] == str(delivery.pk)  # a receiver dedupes
    assert first_body == body and json.loads(body)["type"] == "call.completed"
    assert _verify(secret, first_headers, first_body) and _verify(secret, headers, body)
    assert not _verify(tokens.new_webhook_secret(), headers, body)
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED and delivery.attempts == 2
    log = list(WebhookAttempt.objects.filter(delivery=delivery).values_list("number", "status_code", "error"))
    assert log == [(1, 500, "HTTP 500"), (2, 200, "")]


@pytest.mark.django_db(transaction=True)
def test_outrev_a_receiver_answering_410_gone_is_not_tried_again(settings) -> None:
    settings.ELICIT_WEBHOOK_MAX_ATTEMPTS = 8
    with _scripted(410, 200) as receiver:
        delivery = _delivery(receiver.url)
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None  # the sweep's task: nothing sent

    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED and delivery.attempts == 1
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.status_code == 410 and "410 Gone" in attempt.error and "not tried again" in attempt.error


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


@pytest.mark.django_db(transaction=True)
def test_outrev_a_failed_attempt_says_why_without_the_url() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/hook?token=receiver-secret-123"
    delivery = _delivery(url)
    assert 1.0 <= (webhooks.webhook_attempt(delivery_id=delivery.pk) or 0) <= 2.0
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.status_code is None
    assert attempt.error.startswith("ConnectError: ") and "refused" in attempt.error.lower()
    assert "receiver-secret-123" not in attempt.error and "/hook" not in attempt.error


@pytest.mark.django_db
def test_outrev_a_chat_webhook_answering_410_gone_is_not_tried_again(settings) -> None:
    settings.ELICIT_NOTIFY_MAX_ATTEMPTS = 5
    with _scripted(410, 200) as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        notifications.notify(ir=pending_request(team), team=team, event="routed")
        (notice,) = notices(team, "routed")
        assert notifications.notification_send(notification_id=notice.pk) is None
        assert notifications.notification_send(notification_id=notice.pk) is None

    assert len(chat.received) == 1
    notice.refresh_from_db()
    assert notice.status == Notification.Status.FAILED and notice.attempts == 1
    assert "410 Gone" in notice.last_error and "receiver-secret-123" not in notice.last_error


@pytest.mark.django_db
def test_outrev_a_chat_webhook_answering_500_then_200_is_posted_on_the_retry(settings) -> None:
    with _scripted(500, 200) as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        notifications.notify(ir=pending_request(team), team=team, event="routed")
        (notice,) = notices(team, "routed")
        assert 1.0 <= (notifications.notification_send(notification_id=notice.pk) or 0) <= 2.0
        assert notifications.notification_send(notification_id=notice.pk) is None

    assert len(chat.received) == 2
    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT and notice.attempts == 2 and notice.last_error == ""


@pytest.mark.django_db
def test_outrev_a_notice_whose_team_lost_its_addresses_is_not_recorded_as_sent() -> None:
    from django.core import mail

    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(
        notify_emails="ana@example.org", chat_webhook_url="https://chat.example/h"
    )
    team.refresh_from_db()
    notifications.notify(ir=pending_request(team), team=team, event="routed")
    chat, email = sorted(notices(team, "routed"), key=lambda n: n.kind)
    assert (chat.kind, email.kind) == (Notification.Kind.CHAT, Notification.Kind.EMAIL)
    Team.objects.filter(pk=team.pk).update(notify_emails=" ; ", chat_webhook_url="")  # removed meanwhile

    assert notifications.notification_send(notification_id=email.pk) is None
    assert notifications.notification_send(notification_id=chat.pk) is None

    assert mail.outbox == []
    email.refresh_from_db()
    chat.refresh_from_db()
    assert email.status == chat.status == Notification.Status.FAILED
    assert email.attempts == chat.attempts == 0
    assert email.last_error == "not sent: the team no longer has addresses for notices"
    assert chat.last_error == "not sent: the team no longer has a chat webhook"
