"""Webhook deliveries in the admin: an operator sees each attempt and why it failed, and never the receiver's
token that a callback URL carries in its query."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from approvals.models import WebhookAttempt, WebhookDelivery
from tests import factories

TOKEN = "receiver-token-5e3f9a"


@pytest.fixture
def delivery(db: None) -> WebhookDelivery:
    call = factories.call(factories.server())
    found = WebhookDelivery.objects.create(
        call=call,
        event_type="call.completed",
        url=f"https://agent.example/hooks?token={TOKEN}",
        payload={"type": "call.completed"},
        status=WebhookDelivery.Status.FAILED,
        attempts=2,
    )
    WebhookAttempt.objects.create(delivery=found, number=1, status_code=503, duration_ms=12)
    WebhookAttempt.objects.create(
        delivery=found, number=2, error="ConnectError: [Errno 111] Connection refused", duration_ms=3
    )
    return found


@pytest.fixture
def operator(db: None) -> Client:
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")
    client = Client()
    client.login(username="root", password="pw-root")
    return client


def _page(operator: Client, url: str) -> str:
    response: Any = operator.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_the_list_and_the_delivery_page_mask_the_callbacks_token(operator: Client, delivery: Any) -> None:
    listing = _page(operator, reverse("admin:approvals_webhookdelivery_changelist"))
    page = _page(operator, reverse("admin:approvals_webhookdelivery_change", args=[delivery.pk]))
    for html in (listing, page):
        assert "agent.example/hooks" in html
        assert TOKEN not in html
    assert str(delivery) == "call.completed (failed)"


def test_the_delivery_page_shows_each_attempt_and_why_it_failed(operator: Client, delivery: Any) -> None:
    page = _page(operator, reverse("admin:approvals_webhookdelivery_change", args=[delivery.pk]))
    assert "ConnectError: [Errno 111] Connection refused" in page
    assert "503" in page
    assert 'name="attempt_log-0-error"' not in page  # read-only: the log is the record of what happened
