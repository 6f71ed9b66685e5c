"""Deadlines, run by beat: requests nobody answered in time are shown to a fallback team as well, teams are
told before a round expires, and rounds past their deadline expire."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import (
    Case,
    CharField,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Value,
    When,
)
from django.db.models.functions import Cast, Concat
from django.db.models.signals import post_save, pre_delete
from django.dispatch import receiver
from django.utils import timezone

from approvals import broadcast
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import ExpiryAction, Gate, InputRequest, Notification, Round, Team, ToolCall
from approvals.services import notifications
from approvals.services.calls import call_finish
from approvals.services.rounds import GONE_HANDLERS, expiry_action, notify_holders, round_mark_ready
from approvals.services.routing import ASSIGNEE_DEACTIVATED, ASSIGNEE_DELETED

# When a request's policy sends it on: its creation plus the policy's delay (seconds), computed by PostgreSQL.
_ESCALATES_AT = ExpressionWrapper(
    F("created_at")
    + ExpressionWrapper(
        F("policy__escalate_after") * Value(timedelta(seconds=1)), output_field=DurationField()
    ),
    output_field=DateTimeField(),
)


def _server_waits(now: datetime) -> Q:
    """Requests whose server still waits for them at `now`: it named no wait of its own, or that wait is
    still running."""
    return Q(round__server_deadline__isnull=True) | Q(round__server_deadline__gt=now)


def escalate_due(*, now: datetime, limit: int = 500) -> int:
    """Escalate the pending requests whose policy's delay has passed (at most ``limit`` per run, the longest
    waiting first). Returns how many. The delay is compared in the query: a backlog still within its delay
    (a policy of a day, thousands waiting) is not read on every run.

    A request whose round's deadline has passed is not escalated, though beat (every 15 s, `expire_due`) may
    not have expired it yet: no answer is taken then, and the fallback team would be told "no answer yet"
    and shown a request it cannot answer (a delay as long as the round's clock made that the rule). Nor is a
    URL-mode request made for one person (its assignee): it is theirs alone, so the fallback team's reviewers
    could not open it, and their notice would link to a page they are refused. Nor is one whose policy's
    fallback is the team it waits in already. Nor is a question a server asked on an open session once the
    server stopped waiting for it (`Round.server_deadline`): its holder closes the round ``gone`` when it
    sees that, and until then the fallback team would be sent to a request that goes as they open it."""
    candidates = (
        InputRequest.objects.pending()
        .filter(
            for_requester=False,  # the agent's own person answers those: no team to escalate to
            assignee__isnull=True,
            escalated_at__isnull=True,
            round__deadline__gt=now,
            policy__escalate_after__isnull=False,
            policy__escalation_team__isnull=False,
        )
        .filter(_server_waits(now))
        # A policy whose fallback is the request's own team (set on the policy after its rules were made)
        # would ask no one new: the team would only be told again, as if the request had come to it anew.
        .exclude(team=F("policy__escalation_team"))
        .alias(escalates_at=_ESCALATES_AT)
        .filter(escalates_at__lte=now)
        .select_related("policy__escalation_team", "round__call__server", "team")
        .order_by("created_at")[:limit]
    )
    escalated = 0
    for ir in candidates:
        policy = ir.policy
        # The query above only yields requests whose policy names both a delay and a fallback team.
        assert policy is not None and policy.escalate_after is not None
        assert policy.escalation_team is not None
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


# The event of a round's expiry warning (`notifications.expiring_event`), computed by PostgreSQL.
_EXPIRING_EVENT = Case(
    When(round__extensions=0, then=Value("expiring")),
    default=Concat(Value("expiring."), Cast("round__extensions", CharField())),
    output_field=CharField(),
)
_NOTICE_KINDS = (("team", "team"), ("fallback", "escalation_team"))


def _noticed(team: str, kind: str) -> Exists:
    """Whether the request's `team` (a field) already has a notice of this `kind` for its current warning."""
    return Exists(
        Notification.objects.filter(
            input_request=OuterRef("pk"), team=OuterRef(team), kind=kind, event=OuterRef("expiring_event")
        )
    )


def _unwarned(team: Team | None, email: bool, chat: bool) -> bool:
    """Whether `team` may still lack a notice of the warning: one of the kinds it asks for (by what it has
    configured now) was not made yet. `notifications.notify` decides the rest, once per kind."""
    if team is None:
        return False
    return (bool(team.notify_emails.strip()) and not email) or (bool(team.chat_webhook_url) and not chat)


def warn_expiring(*, now: datetime) -> int:
    """Tell each team once per deadline when a round it holds will expire within ELICIT_EXPIRY_WARNING
    seconds: once, and once more after each extension (a team warned before a reviewer extended the round
    would otherwise hear nothing before the new deadline). Returns how many requests are in that window.

    Beat runs this every 15 s over the whole window: which teams were told already is read with the window,
    in the same statement, so a run costs one statement plus the notices still to make, not a look for the
    notices of every request in the window (of a backlog expiring within ten minutes, every run)."""
    soon = now + timedelta(seconds=settings.ELICIT_EXPIRY_WARNING)
    noticed = {
        f"{name}_{kind}": _noticed(field, kind)
        for name, field in _NOTICE_KINDS
        for kind in (Notification.Kind.EMAIL, Notification.Kind.CHAT)
    }
    pending = (
        InputRequest.objects.pending()
        .filter(
            round__status=Round.Status.OPEN,
            round__deadline__lte=soon,
            round__deadline__gt=now,
            for_requester=False,
        )
        .filter(_server_waits(now))  # one its server stopped waiting for is gone: no deadline to warn of
        # Its team, or the team it was escalated to: a request whose team was deleted while it waited is
        # still answered by its fallback team, which must hear of the deadline.
        .filter(Q(team__isnull=False) | Q(escalation_team__isnull=False))
        .alias(expiring_event=_EXPIRING_EVENT)
        .annotate(**noticed)
        .select_related("team", "escalation_team", "round")
    )
    warned = 0
    for ir in pending:
        teams = [
            team
            for name, team in (("team", ir.team), ("fallback", ir.escalation_team))
            if _unwarned(team, getattr(ir, f"{name}_email"), getattr(ir, f"{name}_chat"))
        ]
        if teams:
            event = notifications.expiring_event(ir.round.extensions)
            with transaction.atomic():
                for team in dict.fromkeys(teams):
                    notifications.notify(ir=ir, team=team, event=event)
        warned += 1
    return warned


def expire_due(*, now: datetime, limit: int = 500) -> int:
    """Expire the rounds whose deadline has passed (at most ``limit`` per run). Returns how many. First, the
    requests made for a person deactivated behind Django's back end (`end_for_inactive`)."""
    end_for_inactive(now=now, limit=limit)
    ids = list(Round.objects.stale(now).values_list("pk", flat=True)[:limit])
    return sum(1 for round_id in ids if round_expire(round_id=round_id, now=now))


ABANDONED_FOR_ASSIGNEE = (
    "The person a request was made for can no longer answer it; the hub abandoned the call."
)
ABANDONED_WITH = "the call was abandoned: another request of its round was made for a person now gone"


def assignee_deleted(*, user_id: Any, now: datetime | None = None) -> int:
    """A user is being deleted (inside the deletion's transaction, before their rows go): the pending url-mode
    requests made for them (their assignee) are theirs alone, since the link is meant for that person; once
    the user is gone the request would fall to the whole team. They end now as an expiry ends a request
    (audited ``input.expired`` with why), under the round's expiry policy: ``cancel`` answers the request
    ``cancel`` and a round with nothing else pending goes on; ``abandon`` abandons the call at once.
    Returns how many ended."""
    now = now or timezone.now()
    with transaction.atomic():
        return _end_assigned(user_id, now, ASSIGNEE_DELETED)


def assignee_deactivated(*, user_id: Any, now: datetime | None = None) -> int:
    """A user was deactivated: they can no longer sign in to open the links made for them, and no one else
    may open them. Their pending url-mode requests end as when the user is deleted (`assignee_deleted`),
    instead of holding the round until its deadline. Returns how many ended."""
    now = now or timezone.now()
    with transaction.atomic():
        return _end_assigned(user_id, now, ASSIGNEE_DEACTIVATED)


@receiver(pre_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="approvals.escalation.user_deleting")
def _user_deleting(instance: Any, **kwargs: Any) -> None:
    """A user about to be deleted: the url-mode requests made for them end first; with the user gone (the
    assignee set to null) they would be answerable by their whole team, who are not meant to open the link."""
    assignee_deleted(user_id=instance.pk)


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="approvals.escalation.user_saved")
def _user_saved(instance: Any, created: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    """A user saved inactive (deactivated in the admin, or by a script): the requests made for them end. A
    deactivation behind Django's back (a queryset ``update()``) is found by beat instead (`expire_due`)."""
    if created or instance.is_active or (update_fields is not None and "is_active" not in update_fields):
        return
    assignee_deactivated(user_id=instance.pk)


def _end_assigned(user_id: Any, now: datetime, reason: str) -> int:
    round_ids = set(
        InputRequest.objects.pending().filter(assignee_id=user_id).values_list("round_id", flat=True)
    )
    ended = 0
    rounds = (
        Round.objects.select_for_update(of=("self",), no_key=True)
        .select_related("call__server")
        .filter(pk__in=round_ids, status=Round.Status.OPEN)
        .order_by("pk")
    )
    for rnd in rounds:
        theirs = list(rnd.input_requests.pending().filter(assignee_id=user_id))
        _end_in_round(rnd, {ir: reason for ir in theirs}, now)
        ended += len(theirs)
    return ended


def _round_opened_for_gone(*, rnd: Round, gone: dict[InputRequest, str]) -> None:
    """A round just opened (`rounds.round_open`) holds requests made for a person who can no longer open
    them: they end at once, as if the person had been deleted or deactivated while they waited."""
    _end_in_round(rnd, gone, timezone.now())


GONE_HANDLERS.append(_round_opened_for_gone)


def _end_in_round(rnd: Round, gone: dict[InputRequest, str], now: datetime) -> None:
    """End the pending requests ``gone`` (each with why) of one open round, locked by the caller, as an
    expiry ends a request, under the round's expiry policy: ``cancel``, and the round goes on once nothing
    else is pending; ``abandon``: the call is abandoned now, the round's other requests ending with it."""
    call = rnd.call
    abandon = call.kind == ToolCall.Kind.CALL and expiry_action(call, rnd) == ExpiryAction.ABANDON
    ending = dict(gone)
    if abandon:
        # Abandoned, the call takes no answer any more: nothing of its round is left waiting.
        for ir in rnd.input_requests.pending():
            ending.setdefault(ir, ABANDONED_WITH)
    InputRequest.objects.filter(pk__in=[ir.pk for ir in ending], status=InputRequest.Status.PENDING).update(
        status=InputRequest.Status.EXPIRED, action=InputRequest.Action.CANCEL, answered_at=now
    )
    for ir, why in ending.items():
        ir.status, ir.action, ir.answered_at = InputRequest.Status.EXPIRED, InputRequest.Action.CANCEL, now
        audit.record(
            actor=Actor.system(),
            verb="input.expired",
            call=call,
            input_request=ir,
            data={"key": ir.key, "reason": why},
        )
    transaction.on_commit(partial(broadcast.queue_changed, "round.closed", call.pk, list(ending)))
    if abandon:
        _abandon(rnd, now, ABANDONED_FOR_ASSIGNEE)
    elif not rnd.input_requests.pending().exists():
        answered = rnd.input_requests.filter(status=InputRequest.Status.ANSWERED).exists()
        round_mark_ready(rnd=rnd, outcome=Round.Outcome.ANSWERED if answered else Round.Outcome.EXPIRED)


def end_for_inactive(*, now: datetime, limit: int = 500) -> int:
    """End the pending requests made for a person deactivated without a save through Django (a queryset
    ``update()``, raw SQL), which `_user_saved` did not see. Returns how many ended."""
    users = list(
        InputRequest.objects.pending()
        .filter(assignee__is_active=False)
        .values_list("assignee_id", flat=True)
        .distinct()[:limit]
    )
    return sum(assignee_deactivated(user_id=user_id, now=now) for user_id in users)


def _abandon(rnd: Round, now: datetime, message: str) -> None:
    """Close the round abandoned and end its call ``expired``, inside the caller's transaction (with the
    round locked and its pending requests already ended)."""
    call = rnd.call
    Round.objects.filter(pk=rnd.pk).update(
        status=Round.Status.CLOSED, closed_at=now, outcome=Round.Outcome.ABANDONED
    )
    rnd.status, rnd.closed_at, rnd.outcome = Round.Status.CLOSED, now, Round.Outcome.ABANDONED
    Gate.objects.filter(round=rnd, status=Gate.Status.OPEN).update(status=Gate.Status.EXPIRED, decided_at=now)
    call_finish(
        call=call,
        status=ToolCall.Status.EXPIRED,
        error={"code": "expired", "message": message},
        verb="call.expired",
    )
    if rnd.kind == Round.Kind.PUSH:
        # A holder waits on the session for this round's answer: it answers the server ``cancel`` now and
        # stops the tool, instead of at its next look at the round.
        notify_holders(f"call:{call.pk}")


def round_expire(*, round_id: int, now: datetime | None = None) -> bool:
    """Past its deadline: unanswered requests expire with ``cancel``; the call resumes or is abandoned."""
    now = now or timezone.now()
    with transaction.atomic():
        rnd = (
            Round.objects.select_for_update(skip_locked=True, of=("self",), no_key=True)
            .select_related("call__server")
            .filter(pk=round_id, status=Round.Status.OPEN, deadline__lte=now)
            .first()
        )
        if rnd is None:
            return False
        call = rnd.call
        expired = list(rnd.input_requests.pending())
        InputRequest.objects.filter(
            pk__in=[ir.pk for ir in expired], status=InputRequest.Status.PENDING
        ).update(status=InputRequest.Status.EXPIRED, action=InputRequest.Action.CANCEL, answered_at=now)
        for ir in expired:
            audit.record(
                actor=Actor.system(), verb="input.expired", call=call, input_request=ir, data={"key": ir.key}
            )
        transaction.on_commit(lambda: broadcast.queue_changed("round.closed", call.pk, expired))
        policy = expiry_action(call, rnd)
        if call.kind == ToolCall.Kind.CALL and policy == ExpiryAction.ABANDON:
            _abandon(rnd, now, "No one answered before the deadline; the hub abandoned the call.")
            return True
        round_mark_ready(rnd=rnd, outcome=Round.Outcome.EXPIRED)
        return True
