"""A team's chat webhook is a URL someone named: each post is judged again and sent to the address judged
(a name re-pointed at the hub's own network after it was stored gets nothing), and a chat answering with a
redirect is not followed. Real loopback listeners; names given addresses by the guard's resolver."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import InputRequest, Notification, Team
from approvals.services import notifications
from tests import factories
from tests.hub import WebhookReceiver
from tests.test_notifications import pending_request

pytestmark = pytest.mark.django_db


def chat_notice(team: Team, url: str, ir: InputRequest | None = None, event: str = "routed") -> Notification:
    """A chat notice of `ir` (else of a new pending request), the team's chat webhook set to `url`."""
    Team.objects.filter(pk=team.pk).update(chat_webhook_url=url)
    team.refresh_from_db()
    return Notification.objects.create(
        team=team, input_request=ir or pending_request(team), kind=Notification.Kind.CHAT, event=event
    )


def test_a_chat_webhook_re_pointed_at_the_hubs_network_gets_nothing(settings, fake_dns) -> None:
    with WebhookReceiver() as chat:
        port = chat.httpd.server_address[1]
        team = factories.team("release")
        fake_dns["hooks.chat.test"] = ["127.0.0.1"]  # public when stored, the loopback by the time it is sent
        settings.ELICIT_OUTBOUND_ALLOW = ""
        refused = chat_notice(team, f"http://hooks.chat.test:{port}/services/T0/B0/s3cret")

        assert notifications.notification_send(notification_id=refused.pk) is None  # not tried again

        refused.refresh_from_db()
        assert refused.status == Notification.Status.FAILED
        assert "loopback" in refused.last_error and "s3cret" not in refused.last_error
        assert chat.received == []

        # Where the operator allows the loopback, the post goes to the address judged, named in its Host.
        settings.ELICIT_OUTBOUND_ALLOW = "127.0.0.1/32"
        url = f"http://hooks.chat.test:{port}/services/T0/B0/s3cret"
        sent = chat_notice(team, url, refused.input_request, event="expiring")
        assert notifications.notification_send(notification_id=sent.pk) is None
        sent.refresh_from_db()
        assert sent.status == Notification.Status.SENT
        assert [r.headers["host"] for r in chat.received] == [f"hooks.chat.test:{port}"]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_chat_answering_with_a_redirect_is_not_followed(settings, status: int) -> None:
    settings.ELICIT_NOTIFY_MAX_ATTEMPTS = 3
    with (
        WebhookReceiver() as elsewhere,
        WebhookReceiver(statuses=(status,), headers=({"Location": elsewhere.url},)) as chat,
    ):
        team = factories.team("release")
        notice = chat_notice(team, chat.url)

        countdown = notifications.notification_send(notification_id=notice.pk)

    assert countdown is not None  # tried again later, as any answer that is not a success
    assert len(chat.received) == 1 and elsewhere.received == []
    notice.refresh_from_db()
    assert (notice.status, notice.last_error) == (Notification.Status.PENDING, f"HTTP {status}")


def test_a_chat_asking_to_wait_is_recorded_as_a_webhook_attempt_is(settings) -> None:
    with WebhookReceiver(statuses=(429,), headers=({"Retry-After": "120"},)) as chat:
        notice = chat_notice(factories.team("release"), chat.url)
        assert notifications.notification_send(notification_id=notice.pk) is not None
    notice.refresh_from_db()
    assert notice.last_error == "HTTP 429; the receiver asked to wait 120 s"
    # The sweep reads the same record: a notice asked to wait is not queued again within its wait.
    assert notifications.notifications_recover(now=timezone.now() + timedelta(minutes=10)) == 0
