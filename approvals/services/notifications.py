"""Team notices (email, Slack-compatible chat webhook) when a request is routed, escalated or about to expire.

Both optional per team, both retried, every one recorded as a Notification row. Notices carry the server's
name as the hub knows it, the tool and the message, and a link; never arguments or answers.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db.models import F
from django.utils import timezone

from approvals import netguard
from approvals.models import InputRequest, Notification, Team
from approvals.queueing import SEND_NOTIFICATION, enqueue_on_commit
from approvals.services.webhooks import retry_countdown

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


def _text(notice: Notification) -> tuple[str, str]:
    ir = notice.input_request
    call = ir.round.call
    headline = HEADLINES.get(notice.event, notice.event).format(team=notice.team.name)
    subject = f"[Elicit Hub] {call.server_name}: {call.tool} {headline}"
    link = f"{settings.ELICIT_PUBLIC_URL.rstrip('/')}/requests/{ir.pk}/"
    body = f"{subject}\n\n{ir.message[:500]}\n\nDeadline: {ir.round.deadline.isoformat()}\nReview: {link}\n"
    return subject, body


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
            send_mail(subject, body, None, recipients)
        else:
            response = netguard.post(
                notice.team.chat_webhook_url, json={"text": body}, timeout=settings.ELICIT_WEBHOOK_TIMEOUT
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
