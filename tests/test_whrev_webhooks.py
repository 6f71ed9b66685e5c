"""A delivery is posted by one worker at a time: a second task for it (the sweep's, queued while a late
retry still waited in a backlog) that runs while the first is posting does nothing, so the agent gets the
result once and the attempt log stays whole.

The receiver is a real loopback listener; the second task runs from inside the first POST, on another thread
with its own database connection, as a second worker would.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import ToolCall, WebhookAttempt, WebhookDelivery
from approvals.services import webhooks
from tests import factories


class MeddlingReceiver:
    """Answers 204 to every POST; during the first, runs `during()` on the handler's thread."""

    def __init__(self, during: Any) -> None:
        self.during = during
        self.posts: list[str] = []
        self.outcome: list[Any] = []

    def __enter__(self) -> MeddlingReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.posts.append(self.headers.get("webhook-id") or body.decode())
                if len(receiver.posts) == 1:
                    try:
                        receiver.outcome.append(receiver.during())
                    finally:
                        connection.close()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"


@pytest.mark.django_db(transaction=True)
def test_a_second_task_for_a_delivery_being_posted_does_not_post_it_again() -> None:
    delivery_id: list[Any] = []
    with MeddlingReceiver(lambda: webhooks.webhook_attempt(delivery_id=str(delivery_id[0]))) as agent:
        call = factories.call(
            factories.server("deploy"),
            callback_url=agent.url,
            status=ToolCall.Status.COMPLETED,
            result={"content": [], "isError": False},
            finished_at=timezone.now() - timedelta(minutes=10),
        )
        delivery = WebhookDelivery.objects.create(
            call=call,
            event_type="call.completed",
            url=agent.url,
            payload={"type": "call.completed", "data": {"id": str(call.pk)}},
        )
        delivery_id.append(delivery.pk)

        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None

    assert agent.outcome == [None]  # the second task found the delivery in hand and left it
    assert agent.posts == [str(delivery.pk)]  # posted once
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED and delivery.attempts == 1
    assert list(WebhookAttempt.objects.filter(delivery=delivery).values_list("number", "status_code")) == [
        (1, 204)
    ]


@pytest.mark.django_db(transaction=True)
def test_the_next_task_for_a_delivery_tries_it_once_the_first_is_done(settings) -> None:
    """The lock is let go: a retry after a failed try is made as before."""
    settings.ELICIT_WEBHOOK_MAX_ATTEMPTS = 3
    call = factories.call(
        factories.server("deploy"),
        callback_url="http://127.0.0.1:9/hook",
        status=ToolCall.Status.COMPLETED,
        result={"content": [], "isError": False},
        finished_at=timezone.now(),
    )
    delivery = WebhookDelivery.objects.create(
        call=call, event_type="call.completed", url="http://127.0.0.1:9/hook", payload={"type": "x"}
    )
    assert 1.0 <= (webhooks.webhook_attempt(delivery_id=delivery.pk) or 0) <= 2.0  # nothing listens on port 9
    assert 2.0 <= (webhooks.webhook_attempt(delivery_id=str(delivery.pk)) or 0) <= 4.0
    assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED and delivery.attempts == 3
