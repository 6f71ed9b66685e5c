"""Who may see and answer what: one place, used by views, the API, the websocket consumer and exports."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.contrib.postgres.expressions import ArraySubquery
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone

import approvals.prepared  # the `any` lookup the querysets below use is registered by importing it
from approvals import broadcast
from approvals.models import (
    AuditEvent,
    Grant,
    GrantQuerySet,
    InputRequest,
    InputRequestQuerySet,
    Membership,
    Team,
    TeamSlug,
    ToolCall,
)

ANSWERING_ROLES = [Membership.Role.REVIEWER, Membership.Role.ADMIN]


def reviewer_teams(user: Any) -> QuerySet[Team]:
    return Team.objects.filter(memberships__user=user, memberships__role__in=ANSWERING_ROLES)


def visible_teams(user: Any) -> QuerySet[Team]:
    return Team.objects.filter(memberships__user=user)


def answerable_input_requests(user: Any, team_ids: list[int] | None = None) -> InputRequestQuerySet:
    """Input requests this user may answer (pending or not): their teams' and escalated ones, unrouted ones
    for staff. A url-mode request made for one person (its assignee) is theirs alone, superusers included:
    the URL was made for them. Membership is read for every request (with a reviewer's token, by the token's
    own statement: `remember_teams`), so removing someone takes effect at once.
    """
    if not user.is_authenticated:
        return InputRequest.objects.none()
    if user.is_superuser:
        return answerable_by(user.pk, superuser=True)
    # The team ids are read here (one small query), not left as a subquery: PostgreSQL then finds the
    # pending requests of those teams through their index instead of testing every pending request.
    # ``team_ids``: the user's answering teams when the caller has just read them.
    teams = answering_team_ids(user) if team_ids is None else team_ids
    return answerable_by(user.pk, staff=bool(user.is_staff), teams=teams)


def answerable_by(
    user_id: Any, *, superuser: bool = False, staff: bool = False, teams: list[int] | None = None
) -> InputRequestQuerySet:
    """``answerable_input_requests`` for a user described by their id, their flags and their answering teams:
    one statement for every list of teams (``any``), so a prepared read can hold it (the inbox page)."""
    # A request passed through to the agent is answered by its own person through the agent, never here.
    qs = InputRequest.objects.filter(for_requester=False)
    mine = Q(assignee=user_id)
    unassigned = Q(assignee__isnull=True)
    if superuser:
        return qs.filter(mine | unassigned)
    scope = Q(team__any=teams or []) | Q(escalation_team__any=teams or [])
    if staff:
        scope |= Q(team__isnull=True)
    return qs.filter(mine | (unassigned & scope))


@dataclass(frozen=True)
class Scope:
    """What ``answerable_input_requests`` needs to know about a user, read once, to decide in Python.

    The websocket consumer decides for each event with it (fetched again every few seconds) instead of a
    query per socket per event; ``may_answer`` and the queryset above apply the same rule.
    """

    user_id: Any
    superuser: bool
    staff: bool
    teams: frozenset[int]


_ANSWERING_TEAMS = approvals.prepared.PreparedRead(
    lambda user: reviewer_teams(user).values_list("pk", flat=True),
    user=Membership._meta.get_field("user"),
)


def with_answering_teams(user_id: Any) -> dict[str, ArraySubquery]:
    """Annotations that bring a user's answering teams along with a read of them (their token's), as two
    columns of the same statement: ``answering_team_ids`` and ``answering_team_slugs``, by id. Then
    `remember_teams`."""
    teams = reviewer_teams(user_id).order_by("pk")
    return {
        "answering_team_ids": ArraySubquery(teams.values("pk")),
        "answering_team_slugs": ArraySubquery(teams.values("slug")),
    }


# Where a user object carries its answering teams as (id, slug), read with the user in this request.
_TEAMS_IN_HAND = "_answering_teams"


def remember_teams(user: Any, row: Any) -> None:
    """The user's answering teams, read with them (`row`, annotated by `with_answering_teams`) in this
    request: the request's reads of its teams use them instead of a statement of their own, until
    `forget_teams`."""
    teams = list(zip(row.answering_team_ids, row.answering_team_slugs, strict=True))
    setattr(user, _TEAMS_IN_HAND, teams)


def forget_teams(user: Any) -> None:
    """Read the user's teams again from here on (a long-poll after its wait: a membership may have gone)."""
    if hasattr(user, _TEAMS_IN_HAND):
        delattr(user, _TEAMS_IN_HAND)


def teams_in_hand(user: Any) -> list[tuple[int, str]] | None:
    """The (id, slug) of the user's answering teams as `remember_teams` left them, or None."""
    return getattr(user, _TEAMS_IN_HAND, None)


def answering_team_ids(user: Any) -> list[int]:
    """The ids of the teams whose requests this (signed-in) user answers: one prepared read, or none when
    they were read with the user in this request (`remember_teams`)."""
    teams = teams_in_hand(user)
    if teams is not None:
        return [pk for pk, _ in teams]
    return _ANSWERING_TEAMS(user=user.pk)


def scope_of(user: Any) -> Scope:
    teams = frozenset(answering_team_ids(user)) if user.is_authenticated else frozenset()
    return Scope(user.pk, bool(user.is_superuser), bool(user.is_staff), teams)


@receiver(post_save, sender=Membership, dispatch_uid="approvals.permissions.membership_saved")
@receiver(post_delete, sender=Membership, dispatch_uid="approvals.permissions.membership_deleted")
def _membership_changed(**kwargs: Any) -> None:
    """A membership made, changed or removed (a team's or a user's deletion removes theirs one by one):
    open sockets read their scopes again once it is committed."""
    transaction.on_commit(broadcast.scopes_changed)


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="approvals.permissions.user_saved")
@receiver(post_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="approvals.permissions.user_deleted")
def _user_changed(created: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    """A user saved or deleted (deactivated, their flags or their password changed): open sockets read their
    users again (`consumers`), and close those no longer signed in. A sign-in's own save of `last_login`
    changes nothing of that."""
    if created or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return
    transaction.on_commit(broadcast.scopes_changed)


@receiver(user_logged_out, dispatch_uid="approvals.permissions.signed_out")
def _signed_out(**kwargs: Any) -> None:
    """A sign-out: the sockets its session opened are closed at their next ping or event."""
    transaction.on_commit(broadcast.scopes_changed)


# Where a browser session keeps when it was signed in (seconds since the epoch), and where a user object read
# for a request made with that session carries it (`remember_session`).
SIGNED_IN_AT = "elicit_signed_in_at"
_SESSION_SIGN_IN = "_session_signed_in_at"


@receiver(user_logged_in, dispatch_uid="approvals.permissions.signed_in")
def _signed_in(request: HttpRequest | None = None, **kwargs: Any) -> None:
    """A sign-in: its session remembers when, so a policy that wants a recent sign-in judges this session's,
    not the user's latest anywhere (`last_login`: a sign-in on a phone would make a week-old browser session
    count as fresh)."""
    session = getattr(request, "session", None)
    if session is not None:
        session[SIGNED_IN_AT] = timezone.now().timestamp()


def remember_session(request: HttpRequest) -> None:
    """The request comes with a browser session (the pages, the API's session auth): its user is judged by
    when this session was signed in (`signed_in_at`). Called where such a request hands its user to the
    services that check a policy's recent sign-in. A session signed in before the hub recorded the time has
    none, and counts as signed in long ago: its reviewer signs in again."""
    value = request.session.get(SIGNED_IN_AT)
    when = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        when = datetime.fromtimestamp(value, tz=UTC)
    setattr(request.user, _SESSION_SIGN_IN, when)


def signed_in_at(user: Any) -> datetime | None:
    """When the user last proved who they are, for the request in hand: the sign-in of its browser session
    (`remember_session`), else (a personal token: no session) their last sign-in anywhere, ``last_login``."""
    if hasattr(user, _SESSION_SIGN_IN):
        return getattr(user, _SESSION_SIGN_IN)
    return user.last_login


class Answerable(Protocol):
    """What ``may_answer`` reads of a request: an InputRequest, or its part a queue notice carries."""

    @property
    def for_requester(self) -> bool: ...
    @property
    def assignee_id(self) -> Any: ...
    @property
    def team_id(self) -> Any: ...
    @property
    def escalation_team_id(self) -> Any: ...


def may_answer(scope: Scope, ir: Answerable) -> bool:
    if ir.for_requester:
        return False
    if ir.assignee_id is not None:
        return bool(ir.assignee_id == scope.user_id)
    if scope.superuser:
        return True
    if ir.team_id in scope.teams or ir.escalation_team_id in scope.teams:
        return True
    return scope.staff and ir.team_id is None


def can_answer(user: Any, input_request: InputRequest) -> bool:
    """Whether the user may answer this request as just read: ``may_answer`` on the user's scope (one query
    for their teams), the rule ``answerable_input_requests`` applies in SQL."""
    return may_answer(scope_of(user), input_request)


def visible_calls(user: Any) -> QuerySet[ToolCall]:
    if not user.is_authenticated:
        return ToolCall.objects.none()
    if user.is_superuser:
        return ToolCall.objects.all()
    teams = visible_teams(user)
    scope = (
        Q(rounds__input_requests__team__in=teams)
        | Q(rounds__input_requests__escalation_team__in=teams)
        | Q(rounds__input_requests__assignee=user)
        | Q(server__default_team__in=teams)
    )
    if user.is_staff:
        scope |= Q(server__default_team__isnull=True)
    return ToolCall.objects.filter(scope).distinct()


def can_view_call(user: Any, call: ToolCall) -> bool:
    return visible_calls(user).filter(pk=call.pk).exists()


def visible_audit_events(user: Any) -> QuerySet[AuditEvent]:
    """Events of the user's teams and of the calls they may see; staff also see unrouted ones.

    An event names its team by slug; which team a slug names is ``TeamSlug``'s (a slug names one team for
    good, and a team keeps the slugs it held), read in one query. A slug an earlier team held first is
    read only for the events of this team's time (``from_id``, ``until_id``)."""
    if not user.is_authenticated:
        return AuditEvent.objects.none()
    if user.is_superuser:
        return AuditEvent.objects.all()
    claims = TeamSlug.objects.filter(team__memberships__user=user).values_list("slug", "from_id", "until_id")
    whole: list[str] = []
    scope = Q(call_id__in=visible_calls(user).values("pk"))
    for slug, from_id, until_id in claims:
        if from_id <= 0 and until_id is None:
            whole.append(slug)
            continue
        part = Q(team_slug=slug, id__gte=from_id)
        if until_id is not None:
            part &= Q(id__lt=until_id)
        scope |= part
    if whole:
        scope |= Q(team_slug__in=whole)
    if user.is_staff:
        scope |= Q(team_slug="")
    return AuditEvent.objects.filter(scope)


def visible_grants(user: Any) -> GrantQuerySet:
    """Grants of the teams the user belongs to (any role); every grant for a superuser."""
    if not user.is_authenticated:
        return Grant.objects.none()
    if user.is_superuser:
        return Grant.objects.all()
    return Grant.objects.filter(team__in=visible_teams(user))


def can_revoke_grant(user: Any, grant: Grant) -> bool:
    """A reviewer (or admin) of the grant's team, or a superuser. Read on every call, like answering."""
    if not user.is_authenticated:
        return False
    return bool(user.is_superuser) or reviewer_teams(user).filter(pk=grant.team_id).exists()
