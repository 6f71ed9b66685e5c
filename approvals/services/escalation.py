"""Escalation and expiry warnings, run by beat: requests nobody answered in time are shown to a fallback
team as well, and teams are told before a round expires."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction

from approvals import broadcast
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import InputRequest, Round
from approvals.services import notifications


def escalate_due(*, now: datetime) -> int:
    """Escalate every pending request whose policy's delay has passed. Returns how many."""
    candidates = (
        InputRequest.objects.pending()
        .filter(
            escalated_at__isnull=True,
            policy__escalate_after__isnull=False,
            policy__escalation_team__isnull=False,
        )
        .select_related("policy__escalation_team", "round__call__server", "team")
    )
    escalated = 0
    for ir in candidates:
        policy = ir.policy
        # The query above only yields requests whose policy names both a delay and a fallback team.
        assert policy is not None and policy.escalate_after is not None
        assert policy.escalation_team is not None
        if ir.created_at + timedelta(seconds=policy.escalate_after) > now:
            continue
        fallback = policy.escalation_team
        with transaction.atomic():
            if not InputRequest.objects.filter(
                pk=ir.pk, status=InputRequest.Status.PENDING, escalated_at__isnull=True
            ).update(escalated_at=now, escalation_team=fallback):
                continue
            ir.escalated_at, ir.escalation_team = now, fallback
            audit.record(
                actor=Actor.system(),
                verb="input.escalated",
                call=ir.round.call,
                input_request=ir,
                team_slug=fallback.slug,
                data={
                    "key": ir.key,
                    "from": ir.team.slug if ir.team else None,
                    "to": fallback.slug,
                    "after_seconds": policy.escalate_after,
                },
            )
            notifications.notify(ir=ir, team=fallback, event="escalated")
            transaction.on_commit(partial(broadcast.input_escalated, ir))
        escalated += 1
    return escalated


def warn_expiring(*, now: datetime) -> int:
    """Tell each team once when a round it holds will expire within ELICIT_EXPIRY_WARNING seconds."""
    soon = now + timedelta(seconds=settings.ELICIT_EXPIRY_WARNING)
    pending = (
        InputRequest.objects.pending()
        .filter(
            round__status=Round.Status.OPEN,
            round__deadline__lte=soon,
            round__deadline__gt=now,
            team__isnull=False,
        )
        .select_related("team", "escalation_team")
    )
    warned = 0
    for ir in pending:
        with transaction.atomic():
            for team in {ir.team, ir.escalation_team} - {None}:
                notifications.notify(ir=ir, team=team, event="expiring")
        warned += 1
    return warned
