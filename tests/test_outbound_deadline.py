"""An outbound POST (an agent's webhook, a team's chat webhook) lasts no longer than its timeout, however
slowly the receiver answers: a receiver that trickles the head of its answer a byte at a time, each byte
well inside the read timeout, must not hold a worker for as long as it likes.

Against a real loopback endpoint that sends its status line and then one header byte every 50 ms for
20 s. Bounding each read alone (httpx's timeout), the hub waits all 20 s.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from approvals import netguard
from approvals.models import Team, WebhookAttempt, WebhookDelivery
from approvals.services import notifications, webhooks
from tests import factories
from tests.test_notifications import notices, pending_request

pytestmark = pytest.mark.timeout(90)

TRICKLE = 400  # header bytes, one per TICK
TICK = 0.05


class Trickler:
    """A loopback endpoint answering every POST with a head that never ends: ``HTTP/1.1 200 OK`` and then
    one byte of a header every `TICK` seconds, `TRICKLE` of them. `whole` tells whether the client stayed
    for all of it; `left` is set once the client went away or the trickle ended."""

    def __init__(self) -> None:
        self.whole = False
        self.left = threading.Event()
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                for _ in range(TRICKLE):
                    if self.stop.wait(TICK):
                        return
                    conn.sendall(b"x")
                self.whole = True
            except OSError:  # the client closed the connection
                pass
            finally:
                self.left.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    server = Trickler()
    try:
        yield server
    finally:
        server.close()


def _gave_up(trickler: Trickler) -> None:
    assert trickler.left.wait(30), "the endpoint is still trickling: the hub is still waiting"
    assert not trickler.whole, "the hub waited for the whole trickle"


def test_post_gives_up_on_a_trickling_answer_at_its_timeout(trickler: Trickler) -> None:
    with pytest.raises(httpx.TimeoutException):
        netguard.post(trickler.url, json={"text": "hello"}, timeout=1)
    _gave_up(trickler)


@pytest.mark.django_db
def test_a_webhook_to_a_trickling_endpoint_is_a_failed_attempt_tried_again(
    trickler: Trickler, settings
) -> None:
    settings.ELICIT_WEBHOOK_TIMEOUT = 1
    call = factories.call(factories.server("deploy"), callback_url=trickler.url)
    delivery = WebhookDelivery.objects.create(
        call=call, event_type="call.completed", url=trickler.url, payload={"type": "call.completed"}
    )

    assert 1.0 <= (webhooks.webhook_attempt(delivery_id=delivery.pk) or 0) <= 2.0
    _gave_up(trickler)
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code is None and attempt.error.startswith("ReadTimeout")
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.PENDING and delivery.attempts == 1


@pytest.mark.django_db
def test_a_chat_notice_to_a_trickling_webhook_is_tried_again(trickler: Trickler, settings) -> None:
    settings.ELICIT_WEBHOOK_TIMEOUT = 1
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(chat_webhook_url=trickler.url)
    team.refresh_from_db()
    notifications.notify(ir=pending_request(team), team=team, event="routed")
    (notice,) = notices(team, "routed")

    assert 1.0 <= (notifications.notification_send(notification_id=notice.pk) or 0) <= 2.0
    _gave_up(trickler)
    notice.refresh_from_db()
    assert notice.last_error.startswith("ReadTimeout")
