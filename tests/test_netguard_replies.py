"""A receiver's answer to an outbound POST (agents' webhooks, teams' chat webhooks) is read no further than
``netguard.MAX_REPLY``: the hub wants its status, and the receiver's URL is an outsider's to name.

Against a real loopback HTTP server that answers every POST with a 64 MB body and counts what it managed to
send before the hub closed the connection. Reading the whole answer, the hub takes all 64 MB.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from approvals import netguard
from approvals.models import WebhookAttempt, WebhookDelivery
from approvals.services import webhooks
from tests import factories

pytestmark = pytest.mark.timeout(60)

BODY = 64 * 1024 * 1024
CHUNK = 64 * 1024


class Flood:
    """A loopback endpoint answering 200 with a `BODY`-byte body; `sent` is what it wrote before the client
    left, `whole` whether the client took all of it."""

    def __init__(self) -> None:
        self.sent = 0
        self.whole = False
        self.done = threading.Event()
        flood = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(BODY))
                self.end_headers()
                try:
                    while flood.sent < BODY:
                        self.wfile.write(b"x" * CHUNK)
                        flood.sent += CHUNK
                    flood.whole = True
                except OSError:  # the client closed the connection
                    pass
                finally:
                    flood.done.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flood() -> Iterator[Flood]:
    server = Flood()
    try:
        yield server
    finally:
        server.close()


def _left_early(flood: Flood) -> None:
    assert flood.done.wait(10), "the server is still sending: the hub kept reading"
    assert not flood.whole
    # What the server wrote before the hub closed: the hub's read plus what the kernel buffers held.
    assert flood.sent < BODY // 4, flood.sent


def test_post_reads_a_huge_answer_no_further_than_the_bound_and_returns_its_status(flood: Flood) -> None:
    started = time.monotonic()
    response = netguard.post(flood.url, json={"text": "hello"}, timeout=10)
    assert response.status_code == 200 and response.is_success
    assert time.monotonic() - started < 5
    _left_early(flood)


def test_a_webhook_answered_with_a_huge_body_is_delivered_all_the_same(db, flood: Flood) -> None:
    """The length of the answer is no failure: the receiver said 200."""
    call = factories.call(factories.server("deploy"), callback_url=flood.url)
    delivery = WebhookDelivery.objects.create(
        call=call, event_type="call.completed", url=flood.url, payload={"type": "call.completed"}
    )
    assert webhooks.webhook_attempt(delivery_id=delivery.pk) is None
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert (attempt.status_code, attempt.error) == (200, "")
    _left_early(flood)
