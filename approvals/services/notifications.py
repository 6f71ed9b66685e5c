"""Team notices (email, Slack-compatible chat webhook) when a request is routed, escalated or about to expire.

Both optional per team, both retried, every one recorded as a Notification row. Notices carry the server's
name as the hub knows it, the tool and the message, and a link; never arguments or answers.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import get_connection, send_mail
from django.db.models import F
from django.utils import timezone

from approvals import netguard
from approvals.models import InputRequest, Notification, Team
from approvals.queueing import SEND_NOTIFICATION, enqueue_on_commit
from approvals.services.webhooks import STALE_AFTER, retry_countdown

HEADLINES = {
    "routed": "asks {team} for input",
    "escalated": "escalated to {team}: no answer yet",
    "expiring": "expires soon, still unanswered",
}


def notify(*, ir: InputRequest, team: Team | None, event: str) -> None:
    """Queue the team's notices for one request, once per kind and event, inside the caller's transaction."""
    if team is None:
        return
    kinds = []
    if team.notify_emails.strip():
        kinds.append(Notification.Kind.EMAIL)
    if team.chat_webhook_url:
        kinds.append(Notification.Kind.CHAT)
    for kind in kinds:
        notice, created = Notification.objects.get_or_create(
            team=team, input_request=ir, kind=kind, event=event
        )
        if created:
            enqueue_on_commit(SEND_NOTIFICATION, notice.pk)


def notifications_recover(*, now: datetime) -> int:
    """Queue again the pending notices of requests still waiting that no task is trying: STALE_AFTER past
    the end of their whole retry schedule, their task was lost (as a webhook's can be). Returns how many."""
    most = settings.ELICIT_NOTIFY_MAX_ATTEMPTS
    schedule = sum(retry_countdown(n, max_attempts=most) or 0 for n in range(1, most))
    ids = Notification.objects.filter(
        input_request__in=InputRequest.objects.pending(),
        status=Notification.Status.PENDING,
        created_at__lte=now - timedelta(seconds=schedule) - STALE_AFTER,
    ).values_list("pk", flat=True)
    requeued = 0
    for notice_id in ids:
        enqueue_on_commit(SEND_NOTIFICATION, notice_id)
        requeued += 1
    return requeued


def _text(notice: Notification) -> tuple[str, str]:
    ir = notice.input_request
    call = ir.round.call
    headline = HEADLINES.get(notice.event, notice.event).format(team=notice.team.name)
    # One line: the tool's name is the agent's or the server's to choose, and a mail header holds no break.
    subject = " ".join(f"[Elicit Hub] {call.server_name}: {call.tool} {headline}".split())
    link = f"{settings.ELICIT_PUBLIC_URL.rstrip('/')}/requests/{ir.pk}/"
    body = f"{subject}\n\n{ir.message[:500]}\n\nDeadline: {ir.round.deadline.isoformat()}\nReview: {link}\n"
    return subject, body


# An @ that starts a word: a mention in chats that read them in plain text (@channel, @here, @name).
_MENTION = re.compile(r"(?<![\w.+-])@")


def _chat_text(text: str) -> str:
    """`text` as a Slack-compatible chat shows it as written: ``&``, ``<`` and ``>`` escaped as Slack asks,
    so a server's message cannot mention ``<!channel>`` or label a link at will (``<url|Review>``), and
    an ``@`` that starts a word kept from mentioning anyone by a word joiner after it."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MENTION.sub("@\u2060", text)


def notification_send(*, notification_id: Any) -> float | None:
    """Try one notice. Returns a countdown when it should be tried again."""
    notice = (
        Notification.objects.select_related("team", "input_request__round__call__server")
        .filter(pk=notification_id, status=Notification.Status.PENDING)
        .first()
    )
    if notice is None:
        return None
    Notification.objects.filter(pk=notice.pk).update(attempts=F("attempts") + 1)
    attempt = notice.attempts + 1
    subject, body = _text(notice)
    try:
        if notice.kind == Notification.Kind.EMAIL:
            recipients = [
                a.strip() for a in notice.team.notify_emails.replace(";", ",").split(",") if a.strip()
            ]
            # Django waits on a mail server for ever unless told: bounded as a chat notice is.
            timeout = settings.EMAIL_TIMEOUT or settings.ELICIT_WEBHOOK_TIMEOUT
            send_mail(subject, body, None, recipients, connection=get_connection(timeout=timeout))
        else:
            response = netguard.post(
                notice.team.chat_webhook_url,
                json={"text": _chat_text(body)},
                timeout=settings.ELICIT_WEBHOOK_TIMEOUT,
            )
            if not response.is_success:  # not raise_for_status(): its message holds the URL, a secret
                raise RuntimeError(f"HTTP {response.status_code}")
    except Exception as exc:  # any failure of the transport is retried, then recorded
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        refused = isinstance(exc, netguard.OutboundRefused) and not exc.transient
        countdown = (
            None if refused else retry_countdown(attempt, max_attempts=settings.ELICIT_NOTIFY_MAX_ATTEMPTS)
        )
        Notification.objects.filter(pk=notice.pk).update(
            last_error=error,
            status=Notification.Status.FAILED if countdown is None else Notification.Status.PENDING,
        )
        return countdown
    Notification.objects.filter(pk=notice.pk).update(
        status=Notification.Status.SENT, sent_at=timezone.now(), last_error=""
    )
    return None
