"""What a team notice carries is the server's and the agent's to word (the question, the tool's name): it
reaches the team as text, never as the chat's markup or the mail's headers.

Chat notices go to a real loopback listener; email through Django's mail (the test outbox).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from django.core import mail
from django.utils import timezone

from approvals.models import InputRequest, Notification, Round, Team
from approvals.services import notifications
from tests import factories
from tests.hub import WebhookReceiver

HOSTILE = (
    "<!channel> Deploy frozen. Sign in again at <https://evil.example/login|Review in Elicit Hub> "
    "& ping @here @everyone"
)


def request_for(team: Team, *, tool: str = "create_deployment", message: str = "Pick one") -> InputRequest:
    call = factories.call(factories.server("deploy", name="Deploy bot", default_team=team), tool=tool)
    rnd = factories.open_round(call, team_=team)
    Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() + timezone.timedelta(hours=1))
    InputRequest.objects.filter(round=rnd).update(message=message)
    return InputRequest.objects.select_related("round__call__server").get(round=rnd)


@pytest.mark.django_db
def test_a_chat_notice_shows_a_servers_markup_as_text() -> None:
    """Slack reads ``<!channel>`` as a mention of everyone and ``<url|label>`` as a link labelled at will: a
    server's question must not ping the whole channel or dress a phishing link as the hub's own."""
    with WebhookReceiver() as chat:
        team = factories.team("release")
        Team.objects.filter(pk=team.pk).update(chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = request_for(team, message=HOSTILE)
        notifications.notify(ir=ir, team=team, event="routed")
        (notice,) = Notification.objects.filter(team=team)
        assert notifications.notification_send(notification_id=notice.pk) is None

    text = chat.received[0].json()["text"]
    assert "<" not in text and ">" not in text, text
    assert "&lt;!channel&gt; Deploy frozen" in text  # escaped as Slack asks: shown as written
    assert "&lt;https://evil.example/login|Review in Elicit Hub&gt; &amp; ping" in text
    assert "@here" not in text and "@everyone" not in text  # chats that read plain @-mentions
    assert "@\u2060here @\u2060everyone" in text
    assert f"/requests/{ir.pk}/" in text


@pytest.mark.django_db
def test_an_email_notice_goes_out_for_a_tool_name_with_a_line_break() -> None:
    """A tool's name is the agent's or the server's to choose; a line break in it must not make every email
    notice of the call fail (the mail library refuses a subject with one) and the team never hear of it."""
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ops@example.org")
    team.refresh_from_db()
    ir = request_for(team, tool="create_deployment\r\nBcc: someone@example.org")
    notifications.notify(ir=ir, team=team, event="routed")
    (notice,) = Notification.objects.filter(team=team)

    assert notifications.notification_send(notification_id=notice.pk) is None
    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT, notice.last_error
    (message,) = mail.outbox
    assert message.to == ["ops@example.org"] and message.bcc == []
    assert message.subject == (
        "[Elicit Hub] Deploy bot: create_deployment Bcc: someone@example.org asks Release for input"
    )


@pytest.fixture
def silent_mail_server() -> Iterator[int]:
    """A loopback port that takes connections and never says a word (a mail server that hangs)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        for conn in held:
            conn.close()


@pytest.mark.django_db
@pytest.mark.timeout(60)
def test_an_email_notice_to_a_mail_server_that_never_answers_is_tried_again(
    silent_mail_server, settings
) -> None:
    """Django waits on a mail server for ever unless told otherwise: the notice is bounded as a chat one is,
    so a hung relay costs the worker a timeout, not the task's whole time limit, and the notice is retried."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", silent_mail_server
    settings.ELICIT_WEBHOOK_TIMEOUT = 1
    team = factories.team("release")
    Team.objects.filter(pk=team.pk).update(notify_emails="ops@example.org")
    team.refresh_from_db()
    notifications.notify(ir=request_for(team), team=team, event="routed")
    (notice,) = Notification.objects.filter(team=team)

    assert 1.0 <= (notifications.notification_send(notification_id=notice.pk) or 0) <= 2.0
    notice.refresh_from_db()
    assert notice.status == Notification.Status.PENDING and "timed out" in notice.last_error
