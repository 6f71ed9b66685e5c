"""Celery tasks: thin, idempotent, keyed by ids. The services hold the logic; retry policy lives here.

Services queue these by name through ``approvals.queueing`` and never import this module.
"""

from __future__ import annotations

from datetime import timedelta
from importlib import import_module

from celery import shared_task
from django.conf import settings
from django.utils import timezone

# Periodic chain verification lives beside the audit code; importing it registers it with the worker.
from approvals.audit.tasks import verify_chain
from approvals.models import Round, ToolCall
from approvals.services import (
    escalation,
    holding,
    notifications,
    presence,
    rounds,
    sending,
    servers,
    webhooks,
)

# A send claimed this long ago with no worker holding its lock was orphaned (e.g. by a killed worker).
STUCK_AFTER = timedelta(seconds=90)


@shared_task(bind=True, max_retries=None)
def run_call(self, call_id: str) -> None:
    """Send whatever the call needs next: its first tools/call, or the retry of an answered round."""
    countdown = sending.call_send(call_id=call_id)
    if countdown is not None:
        raise self.retry(countdown=countdown)


@shared_task
def expire_stale() -> int:
    return escalation.expire_due(now=timezone.now())


@shared_task
def recover_stuck(grace_seconds: float | None = None) -> int:
    """Re-queue sends that no worker is doing: queued calls never picked up, orphaned claims; and the
    webhooks and team notices whose task was lost."""
    cutoff = timezone.now() - (timedelta(seconds=grace_seconds) if grace_seconds is not None else STUCK_AFTER)
    requeued = 0
    # Not a call a holder runs: no task would act on it, and `sweep_holders` mends the holder's loss.
    calls = ToolCall.objects.filter(
        kind=ToolCall.Kind.CALL,
        status__in=[ToolCall.Status.QUEUED, ToolCall.Status.RUNNING],
        updated_at__lt=cutoff,
        holder__isnull=True,
    ).values_list("pk", flat=True)
    for call_id in calls:
        if not sending.is_sending(call_id):
            run_call.delay(str(call_id))
            requeued += 1
    # A round's retry: answered, and its call not touched since (a retry waiting out its backoff touches it).
    retries = Round.objects.filter(
        status__in=[Round.Status.READY, Round.Status.SENDING],
        answered_at__lt=cutoff,
        call__updated_at__lt=cutoff,
        call__holder__isnull=True,
    ).values_list("call_id", flat=True)
    for call_id in retries:
        if not sending.is_sending(call_id):
            run_call.delay(str(call_id))
            requeued += 1
    requeued += webhooks.webhooks_recover(now=timezone.now())
    return requeued + notifications.notifications_recover(now=timezone.now())


@shared_task
def sweep_holders() -> int:
    """Declare lost the holder processes whose heartbeat stopped; returns the calls that ended with them."""
    return holding.holders_sweep()


@shared_task
def escalate_and_warn() -> int:
    """Warn teams of rounds about to expire, then escalate what waited too long; returns the escalated."""
    now = timezone.now()
    escalation.warn_expiring(now=now)
    return escalation.escalate_due(now=now)


@shared_task
def sweep_presence() -> int:
    """Clear from the teams' pages the viewers whose page went without a word and whom nobody follows."""
    return presence.presence_sweep()


@shared_task
def refresh_tool_lists() -> int:
    """Probe the servers whose tool list is older than ELICIT_TOOLS_REFRESH_INTERVAL."""
    return servers.servers_refresh_stale()


@shared_task
def forget_request_states() -> int:
    """Clear the servers' requestState of the calls that ended (no retry will echo it); returns how many."""
    return rounds.rounds_forget_state()


@shared_task
def clear_expired_sessions() -> None:
    """Delete the reviewers' expired sign-in sessions, as ``manage.py clearsessions`` does: Django leaves them
    in the table until something does, one row per sign-in for good."""
    import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()


@shared_task(bind=True, max_retries=None)
def send_notification(self, notification_id: int) -> None:
    countdown = notifications.notification_send(notification_id=notification_id, when_due=True)
    if countdown is not None:
        raise self.retry(countdown=countdown)


@shared_task(bind=True, max_retries=None)
def deliver_webhook(self, delivery_id: str) -> None:
    countdown = webhooks.webhook_attempt(delivery_id=delivery_id, when_due=True)
    if countdown is not None:
        raise self.retry(countdown=countdown)


# --- former names, kept for one release: messages a running deployment queued under them still run -------


@shared_task(bind=True, max_retries=None, name="approvals.tasks.resume_call")
def resume_call(self, round_id: int) -> None:
    """Former ``resume_call(round_id)``: now ``run_call(call_id)``."""
    call_id = Round.objects.filter(pk=round_id).values_list("call_id", flat=True).first()
    if call_id is None:
        return
    countdown = sending.call_send(call_id=call_id)
    if countdown is not None:
        raise self.retry(countdown=countdown)


@shared_task(name="approvals.tasks.escalate_due")
def escalate_due() -> int:
    """Former name of ``escalate_and_warn``."""
    return escalate_and_warn()


__all__ = [
    "deliver_webhook",
    "escalate_and_warn",
    "escalate_due",
    "expire_stale",
    "forget_request_states",
    "recover_stuck",
    "resume_call",
    "run_call",
    "send_notification",
    "sweep_presence",
    "verify_chain",
]
