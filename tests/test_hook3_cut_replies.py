"""A receiver that accepts a delivery says so with its status (Standard Webhooks: any 2xx). The rest of its
answer is read only to close the connection politely: a body cut short (the connection reset after the
status, a ``Content-Length`` the body never reaches, a broken chunk) must not turn an accepted delivery into
a failed one, sent again and again to a receiver that already has it.

The receivers are real loopback listeners that answer with the bytes given, then hang up."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from approvals import netguard
from approvals.models import Notification, Team, WebhookAttempt, WebhookDelivery
from approvals.services import notifications, webhooks
from tests import factories
from tests.test_notifications import notices, pending_request
from tests.test_outrev_webhooks import _delivery

CUT_SHORT = {
    "length": b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"ok":',
    "chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@dataclass
class Listener:
    url: str
    received: list[bytes] = field(default_factory=list)  # each request's body


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@contextmanager
def answering(reply: bytes) -> Iterator[Listener]:
    """A listener that reads each request whole, answers it with `reply` and hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = Listener(f"http://127.0.0.1:{listener.getsockname()[1]}/hook")

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                while len(body) < _content_length(head) and (chunk := conn.recv(65536)):
                    body += chunk
                seen.received.append(body)
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield seen
    finally:
        listener.close()


@pytest.mark.parametrize("kind", sorted(CUT_SHORT))
def test_post_returns_the_status_of_an_answer_whose_body_is_cut_short(kind: str) -> None:
    with answering(CUT_SHORT[kind]) as receiver:
        response = netguard.post(receiver.url, content=b"{}", timeout=5)
    assert response.status_code == 200
    assert receiver.received == [b"{}"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", sorted(CUT_SHORT))
def test_a_webhook_accepted_with_a_body_cut_short_is_delivered_once(kind: str) -> None:
    with answering(CUT_SHORT[kind]) as receiver:
        delivery = _delivery(receiver.url)
        assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None  # no retry

    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert (attempt.status_code, attempt.error) == (200, "")


@pytest.mark.django_db
def test_a_chat_notice_accepted_with_a_body_cut_short_is_sent_once() -> None:
    with answering(CUT_SHORT["length"]) as receiver:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=receiver.url)
        team.refresh_from_db()
        notifications.notify(ir=pending_request(team), team=team, event="routed")
        (notice,) = notices(team, "routed")
        assert notifications.notification_send(notification_id=notice.pk) is None

    assert len(receiver.received) == 1
    notice.refresh_from_db()
    assert (notice.status, notice.last_error) == (Notification.Status.SENT, "")
