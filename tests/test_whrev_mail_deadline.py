"""An email notice lasts no longer than its timeout, however slowly the mail server answers, as a chat notice
does: a server that trickles its greeting a byte at a time, each byte well inside the socket's timeout, must
not hold a worker for as long as it likes.

Against a real loopback port that sends ``220-`` and then one byte every 50 ms for 20 s, through Django's
SMTP backend. Bounding each read alone (the socket timeout), the hub waits all 20 s.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from approvals.models import Notification, Team
from approvals.services import notifications
from tests import factories
from tests.test_notifications import pending_request

pytestmark = pytest.mark.timeout(90)

TRICKLE = 400  # greeting bytes, one per TICK
TICK = 0.05


class TricklingMailServer:
    """Answers every connection with a greeting that never ends. `whole` tells whether the client stayed for
    all of it; `left` is set once the client went away or the trickle ended."""

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
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(b"220-")
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
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def trickler() -> Iterator[TricklingMailServer]:
    server = TricklingMailServer()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.django_db
def test_an_email_notice_to_a_trickling_mail_server_is_tried_again_at_its_timeout(
    trickler: TricklingMailServer, settings
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", trickler.port
    settings.ELICIT_WEBHOOK_TIMEOUT = 1
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ops@example.org")
    team.refresh_from_db()
    notifications.notify(ir=pending_request(team), team=team, event="routed")
    (notice,) = Notification.objects.filter(team=team)

    assert 1.0 <= (notifications.notification_send(notification_id=notice.pk) or 0) <= 2.0
    assert trickler.left.wait(30), "the server is still trickling: the hub is still waiting"
    assert not trickler.whole, "the hub waited for the whole greeting"
    notice.refresh_from_db()
    assert notice.status == Notification.Status.PENDING and notice.attempts == 1
    assert notice.last_error.startswith("MailTimeout: the mail server timed out"), notice.last_error


def test_a_mail_backend_other_than_smtp_is_used_as_configured(settings) -> None:
    """The bound applies to Django's SMTP backend; any other (the test outbox here) sends as before."""
    from django.core import mail

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    notifications._send_mail("subject", "body", ["ops@example.org"])
    assert [m.to for m in mail.outbox] == [["ops@example.org"]]
