"""Remembered grants: "allow the same again" when a reviewer approves a gated call.

A grant covers one agent, the person it acts for (or no one), one server and tool as the hub held its
definition when approved (``tool_digest``), and either exactly the approved arguments (their canonical digest)
or any arguments meeting stated conditions (``RoutingRule.conditions``' shape, checked with ``rules.holds``).
It lasts 1 h, 8 h or until revoked. The gate asks ``find`` before it stops a call; a grant found lets the
call through without a person and ``use`` records it (audited ``gate.granted``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Value,
    When,
)
from django.utils import timezone

from approvals import canonical, permissions, rules, safejson
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import (
    AgentClient,
    AuditEvent,
    Grant,
    GrantQuerySet,
    InputRequest,
    Membership,
    RoutingRule,
    Team,
    TeamSlug,
    ToolCall,
)
from approvals.services.errors import Conflict, Forbidden, Invalid, moment

DURATIONS: dict[str, timedelta | None] = {
    "1h": timedelta(hours=1),
    "8h": timedelta(hours=8),
    "until_revoked": None,
}
MODES = tuple(Grant.Arguments.values)
MAX_CONDITIONS = 20
MAX_CONDITION_VALUE = 2000  # characters of one condition's value, as canonical JSON
STATES = ("active", "expired", "revoked")

# Set by ``find`` on a grant it locked: the moment it judged the grant active (``use`` reads it).
_FOUND_AT = "_grant_found_at"

# The browser form's field names (approvals/_grant_fields.html).
FIELD_FOR = "grant_for"
FIELD_ARGUMENTS = "grant_arguments"
FIELD_CONDITION = "grant_condition"


# --- matching -----------------------------------------------------------------------------------------------


def covers(grant: Grant, arguments: dict[str, Any]) -> bool:
    """Whether the grant's arguments part admits these arguments (the rest is matched in SQL by ``find``)."""
    if grant.arguments_mode == Grant.Arguments.EXACT:
        try:
            return canonical.digest(arguments) == grant.arguments_digest
        except canonical.CanonicalError:
            return False
    return _conditions_hold(grant.conditions or [], arguments)


def _conditions_hold(conditions: list[dict[str, Any]], arguments: dict[str, Any]) -> bool:
    """Every condition is well formed and holds for the arguments (none: nothing is admitted)."""
    if not conditions:
        return False
    return all(
        not rules.check_condition(condition) and _admits(condition, arguments) for condition in conditions
    )


def _admits(condition: dict[str, Any], arguments: dict[str, Any]) -> bool:
    """One condition holds for the arguments. An argument given as null meets no ``!=`` or ``not in``, as one
    not given meets none (``rules.holds``): a server reads null as "my default", which the hub cannot see and
    which may be the very value the condition excludes (``environment != "production"``)."""
    if condition.get("op") in ("!=", "not in") and rules.argument(arguments, condition["argument"]) is None:
        return False
    return rules.holds(condition, arguments).matched


def outranked_by(rule: RoutingRule) -> str | None:
    """Why no grant may stand in for the gate ``rule`` opens, or None: a policy needing several approvals is
    more than the one reviewer who made a grant may give."""
    required = rule.policy.approvals_required if rule.policy_id and rule.policy else 1
    if required > 1:
        return f"the rule {rule.name!r} needs {required} approvals, which no grant stands in for"
    return None


def grantor_stands() -> Q:
    """The grants whose grantor could make them still: an active account, a reviewer (or admin) of the grant's
    team or a superuser. A grant is that person's word for later calls, so it holds only while they could
    give it: removed from the team, lowered to viewer, deactivated or deleted, and it lets nothing through
    (as their standing approval of an N-of-M request no longer counts). Nor while they own its agent: made
    the agent's owner since, they would be approving their own agent's calls, which no reviewer may do at
    the gate (the person a grant acts for is never its grantor: they could not approve the call)."""
    # Subqueries on the grant's own row, not a join: an UPDATE filtered by them (``use``) then tests the
    # grant's state on the row it changes. Through a join, Django updates ``WHERE id IN (SELECT ...)``, and
    # a revoke committed while that UPDATE waited for the row is not seen by the subquery's older copy.
    superuser = get_user_model().objects.filter(pk=OuterRef("granted_by"), is_active=True, is_superuser=True)
    reviewer = Membership.objects.filter(
        user=OuterRef("granted_by"),
        user__is_active=True,
        team=OuterRef("team"),
        role__in=permissions.ANSWERING_ROLES,
    )
    owns_the_agent = AgentClient.objects.filter(pk=OuterRef("agent"), owner=OuterRef("granted_by"))
    return (Q(Exists(superuser)) | Q(Exists(reviewer))) & ~Q(Exists(owns_the_agent))


def grantor_gone(grant: Grant) -> str | None:
    """Why the grant's grantor could not make it now (``grantor_stands``), or None."""
    grantor = grant.granted_by
    if grantor is None:
        return "the reviewer who granted it was deleted"
    who = grantor.get_username()
    if not grantor.is_active:
        return f"{who}, who granted it, was deactivated"
    if AgentClient.objects.filter(pk=grant.agent_id, owner=grantor).exists():
        return f"{who}, who granted it, now owns the agent"
    if grantor.is_superuser:
        return None
    reviewer = Membership.objects.filter(
        user=grantor, team_id=grant.team_id, role__in=permissions.ANSWERING_ROLES
    ).exists()
    return None if reviewer else f"{who}, who granted it, is no longer a reviewer of team {grant.team.slug}"


def find(*, call: ToolCall, tool_digest: str, rule: RoutingRule | None = None) -> Grant | None:
    """An active grant covering this call: same agent, person, server and tool, the same tool definition, and
    exactly these arguments or arguments meeting its conditions. Expired or revoked grants never match, nor
    one whose grantor could not make it now (``grantor_stands``).

    ``rule``: the gate rule that stops the call. A grant stands in only for its own team's gate (another
    team's rule is not its team's to decide), and never for a gate needing several approvals.

    Inside a transaction the grant found is locked until it commits, so a revoke racing the gate waits for
    it: a call let through by a grant was let through before the grant was revoked."""
    if call.agent_id is None or call.server_id is None:
        return None
    if rule is not None and outranked_by(rule):
        return None
    now = timezone.now()
    candidates = Grant.objects.active(now).filter(
        grantor_stands(),
        agent_id=call.agent_id,
        server_id=call.server_id,
        tool=call.tool,
        tool_digest=tool_digest,
        on_behalf_of_id=call.on_behalf_of_id,
    )
    if rule is not None:
        candidates = candidates.filter(team_id=rule.team_id)
    # Exact grants first, then the one made first: the same call always meets the same grant.
    candidates = candidates.order_by("-arguments_mode", "created_at")
    locked = connection.in_atomic_block
    if locked:
        candidates = candidates.select_for_update(of=("self",), no_key=True)
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    found = next((grant for grant in candidates if covers(grant, arguments)), None)
    if found is not None and locked:
        setattr(found, _FOUND_AT, now)  # ``use`` in this transaction counts it as of this moment
    return found


def lapsed(*, call: ToolCall, tool_digest: str, rule: RoutingRule | None = None) -> str | None:
    """Just before the first send of a call a grant let through (inside the claiming transaction): None while
    that grant still covers it, else why not (revoked, expired or deleted since; its grantor could not make
    it now; the tool's definition, as the hub holds it now, is not the one granted; ``rule``, the gate rule
    that stops the call now, is another team's or needs several approvals).

    The grant is locked until the send is claimed, so a revoke racing the send waits for it: a call that went
    was sent before the grant was revoked, and one claimed after stops at a gate."""
    if call.grant_id is None:
        return "no grant let it through"
    grant = (
        Grant.objects.select_for_update(of=("self",), no_key=True)
        .select_related("revoked_by", "granted_by", "team")
        .filter(pk=call.grant_id)
        .first()
    )
    if grant is None:
        return "the grant that let it through was deleted"
    if grant.state() != "active":
        return f"the grant that let it through was {describe_end(grant)}"
    if why := grantor_gone(grant):
        return why
    if grant.tool_digest != tool_digest:
        return "the tool's definition changed on the server since the grant let it through"
    if rule is not None and rule.team_id != grant.team_id:
        return f"the rule {rule.name!r} now sends it to team {rule.team.slug}, not the grant's team"
    if rule is not None and (why := outranked_by(rule)):
        return why
    if not covers(grant, call.arguments if isinstance(call.arguments, dict) else {}):
        return "the grant that let it through no longer covers its arguments"
    return None


def use(grant: Grant, call: ToolCall) -> None:
    """Record that ``grant`` let ``call`` through: its use count, the grant on the call, and ``gate.granted``.

    Found by ``find`` in the same transaction, the grant is locked, and was judged (active, its grantor
    standing) as that moment: the call was let through then, even if the grant expired or its grantor was
    removed the instant after (the first send checks the grant again, ``lapsed``). Otherwise raises
    Conflict when the grant was revoked or expired since ``find``, or its grantor could no longer make it."""
    now = timezone.now()
    found_at = getattr(grant, _FOUND_AT, None) if connection.in_atomic_block else None
    if hasattr(grant, _FOUND_AT):
        delattr(grant, _FOUND_AT)  # one use per ``find``
    usable = (
        Grant.objects.active(found_at)
        if found_at is not None
        else Grant.objects.active(now).filter(grantor_stands())
    )
    with transaction.atomic():
        updated = usable.filter(pk=grant.pk).update(uses=F("uses") + 1, last_used_at=now)
        if not updated:
            raise Conflict(
                "This grant was revoked or expired, or its grantor can no longer approve for its team; the "
                "call needs a person.",
                code="grant_inactive",
            )
        # The call remembers its grant: the first send checks it again (`lapsed`).
        ToolCall.objects.filter(pk=call.pk).update(grant=grant)
        call.grant = grant
        audit.record(
            actor=Actor.system(),
            verb="gate.granted",
            call=call,
            team_slug=grant.team.slug,
            data={
                "grant": str(grant.pk),
                "server": call.server_slug,
                "tool": call.tool,
                "team": grant.team.slug,
            },
        )
    grant.uses += 1
    grant.last_used_at = now


# --- making one ---------------------------------------------------------------------------------------------


def parse_choice(data: Any) -> dict[str, Any] | None:
    """The reviewer's "also allow the same again" choice, from the API body's ``grant`` object or the browser
    form's fields; None when they chose no grant. Raises Invalid (with ``fields``) on anything malformed.

    The result: ``{"for": "1h" | "8h" | "until_revoked", "arguments": "exact" | "conditions",
    "conditions": [{"argument", "op", "value"}, ...]}`` (conditions empty for "exact")."""
    if data is None:
        return None
    if hasattr(data, "getlist"):  # a QueryDict: the approve form
        chosen = str(data.get(FIELD_FOR, "") or "")
        if not chosen:
            return None
        raw_conditions: Any = []
        for text in data.getlist(FIELD_CONDITION):
            try:
                raw_conditions.append(safejson.loads(text.encode(), max_depth=8))
            except ValueError:
                raise Invalid(
                    "A condition of the grant is not valid JSON.",
                    code="invalid_grant",
                    fields={"grant": "condition"},
                ) from None
        data = {
            "for": chosen,
            "arguments": data.get(FIELD_ARGUMENTS, "exact"),
            "conditions": raw_conditions,
        }
    if not isinstance(data, Mapping):
        raise Invalid("grant must be an object.", code="invalid_grant", fields={"grant": "must be an object"})
    unknown = sorted(set(data) - {"for", "arguments", "conditions"})
    if unknown:
        raise Invalid(
            f"grant has unknown keys: {', '.join(unknown)}.",
            code="invalid_grant",
            fields={"grant": "unknown keys"},
        )
    duration = data.get("for")
    if not isinstance(duration, str) or duration not in DURATIONS:
        raise Invalid(
            "grant.for must be 1h, 8h or until_revoked.",
            code="invalid_grant",
            fields={"grant.for": "invalid"},
        )
    mode = data.get("arguments", Grant.Arguments.EXACT)
    if not isinstance(mode, str) or mode not in MODES:
        raise Invalid(
            "grant.arguments must be exact or conditions.",
            code="invalid_grant",
            fields={"grant.arguments": "invalid"},
        )
    conditions = data.get("conditions") or []
    if mode == Grant.Arguments.EXACT:
        return {"for": duration, "arguments": mode, "conditions": []}
    return {"for": duration, "arguments": mode, "conditions": _clean_conditions(conditions)}


def _clean_conditions(conditions: Any) -> list[dict[str, Any]]:
    def bad(message: str) -> Invalid:
        return Invalid(message, code="invalid_grant", fields={"grant.conditions": message})

    if not isinstance(conditions, list) or not conditions:
        raise bad("A grant on conditions needs at least one condition.")
    if len(conditions) > MAX_CONDITIONS:
        raise bad(f"A grant holds at most {MAX_CONDITIONS} conditions.")
    cleaned = []
    for condition in conditions:
        problem = rules.check_condition(condition)
        if problem:
            raise bad(f"Condition {condition!r:.80}: {problem}.")
        op = condition.get("op", "==")
        if len(condition["argument"]) > 200:
            raise bad("An argument name is longer than 200 characters.")
        item: dict[str, Any] = {"argument": condition["argument"], "op": op}
        if op != "exists":
            try:
                size = len(canonical.canonical_json(condition["value"]))
            except canonical.CanonicalError as exc:
                raise bad(f"The value for {condition['argument']} is not plain JSON: {exc}") from None
            if size > MAX_CONDITION_VALUE:
                raise bad(
                    f"The value for {condition['argument']} is longer than {MAX_CONDITION_VALUE} characters."
                )
            item["value"] = condition["value"]
        cleaned.append(item)
    return cleaned


def check_choice(choice: Any, arguments: Any) -> dict[str, Any]:
    """``choice`` (as `parse_choice` reads it) checked against the arguments it would be made for: an exact
    grant needs their canonical digest, and a grant on conditions must admit them. Returns the parsed choice;
    raises Invalid saying why not. Gate decisions call it before deciding, so a refused grant decides
    nothing."""
    checked = parse_choice(choice)
    if checked is None:
        raise Invalid("No grant was chosen.", code="invalid_grant")
    approved = arguments if isinstance(arguments, dict) else {}
    if checked["arguments"] == Grant.Arguments.EXACT:
        try:
            canonical.digest(approved)
        except canonical.CanonicalError as exc:
            raise Invalid(f"These arguments cannot be granted exactly: {exc}", code="invalid_grant") from None
    elif not _conditions_hold(checked["conditions"], approved):
        raise Invalid(
            "No grant was made: its conditions do not hold for the approved arguments.",
            code="invalid_grant",
            fields={"grant.conditions": "must hold for the approved arguments"},
        )
    return checked


def create_from_approval(
    *,
    approver: Any,
    call: ToolCall,
    tool_digest: str,
    choice: dict[str, Any],
    team: Team | None = None,
    arguments: dict[str, Any] | None = None,
) -> Grant:
    """Remember an approval as a grant (``choice`` from ``parse_choice``), audited ``grant.created``.

    ``arguments`` are the approved ones (after any edit; the call's own by default): an exact grant covers
    them, and a grant on conditions must admit them. ``team`` is the team whose gate was approved (by default
    the team the call's latest request was routed to, else the server's default team)."""
    approved = call.arguments if arguments is None else arguments
    if not isinstance(approved, dict):
        approved = {}
    checked = check_choice(choice, approved)
    if call.agent_id is None or call.server_id is None:
        raise Invalid("Only a hub-driven call of a known agent can be granted again.", code="invalid_grant")
    team = team or _team_of(call)
    if team is None:
        raise Invalid("This call is routed to no team, so no team could own a grant.", code="invalid_grant")
    now = timezone.now()
    duration = DURATIONS[checked["for"]]
    grant = Grant(
        agent_id=call.agent_id,
        on_behalf_of_id=call.on_behalf_of_id,
        server_id=call.server_id,
        tool=call.tool,
        tool_digest=tool_digest,
        arguments_mode=checked["arguments"],
        team=team,
        granted_by=approver,
        source_call=call,
        created_at=now,
        expires_at=now + duration if duration else None,
    )
    if checked["arguments"] == Grant.Arguments.EXACT:
        grant.arguments_digest = canonical.digest(approved)
        grant.arguments = approved
    else:
        grant.conditions = checked["conditions"]
    with transaction.atomic():
        grant.save(force_insert=True)
        audit.record(
            actor=Actor.user(approver),
            verb="grant.created",
            call=call,
            team_slug=team.slug,
            data={
                "grant": str(grant.pk),
                "agent": call.agent.name if call.agent else "",
                "for": checked["for"],
                "expires_at": grant.expires_at.isoformat() if grant.expires_at else None,
                "arguments": grant.arguments_mode,
                "conditions": _audited(grant.conditions),
                "tool_digest": tool_digest,
            },
        )
    return grant


def _audited(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions as the audit log keeps them: the value of a secret-looking argument (``api_key ==
    "..."``) redacted, as the call's own arguments are."""
    return [
        {**c, "value": audit.redact({c["argument"]: c["value"]})[c["argument"]]} if "value" in c else c
        for c in conditions
    ]


def _team_of(call: ToolCall) -> Team | None:
    routed = (
        InputRequest.objects.filter(round__call=call, team__isnull=False)
        .select_related("team")
        .order_by("-round__number", "-created_at")
        .first()
    )
    if routed is not None:
        return routed.team
    return call.server.default_team if call.server else None


# --- revoking and listing -----------------------------------------------------------------------------------


def describe_end(grant: Grant) -> str:
    """ "revoked by alice at 10:42" / "expired at 11:00" — what a second revoke is told."""
    if grant.revoked_at is not None:
        # Only a person revokes (``revoke``): none named is one deleted since, not the hub.
        who = grant.revoked_by.get_username() if grant.revoked_by else "a user since deleted"
        return f"revoked by {who} at {moment(grant.revoked_at)}"
    if grant.expires_at is not None:
        return f"expired at {moment(grant.expires_at)}"
    return "active"


def revoke(*, grant: Grant, by: Any) -> Grant:
    """Stop the grant: the next call it would have covered opens a gate again. A reviewer of the grant's team
    (or a superuser) may; anyone else is refused, and the refusal recorded (``refuse``). A grant already
    revoked or expired is a Conflict that says since when."""
    if not permissions.can_revoke_grant(by, grant):
        refuse(grant, by=by, code="forbidden")
        raise Forbidden("Only a reviewer of the grant's team can revoke it.", code="forbidden")
    now = timezone.now()
    with transaction.atomic():
        updated = Grant.objects.active(now).filter(pk=grant.pk).update(revoked_at=now, revoked_by=by)
        grant.refresh_from_db()
        if not updated:
            raise Conflict(f"This grant was already {describe_end(grant)}.", code="grant_inactive")
        audit.record(
            actor=Actor.user(by),
            verb="grant.revoked",
            call=grant.source_call,
            team_slug=grant.team.slug,
            data={**grant.audit_data(), "uses": grant.uses},
        )
    return grant


def refuse(grant: Grant, *, by: Any, code: str) -> None:
    """Record a refused revoke of ``grant`` (refusals are part of the history too, as a refused answer's
    ``input.refused`` is) in its own transaction, so the error that follows rolls nothing of it back.
    ``by``: the user or agent refused; ``code``: the error they were answered. The grant is named, never its
    arguments or conditions."""
    actor = Actor.agent(by) if isinstance(by, AgentClient) else Actor.user(by)
    with transaction.atomic():
        audit.record(
            actor=actor,
            verb="grant.refused",
            call=grant.source_call,
            team_slug=grant.team.slug,
            data={**grant.audit_data(), "code": code},
        )


def refuse_by_id(grant_id: Any, *, by: Any, code: str) -> None:
    """A revoke refused before the grant was looked at (an agent's): recorded when the grant exists."""
    grant = Grant.objects.select_related("team", "server", "source_call").filter(pk=grant_id).first()
    if grant is not None:
        refuse(grant, by=by, code=code)


def for_revoke(*, grant_id: Any, user: Any) -> Grant | None:
    """The grant ``user`` asks to revoke, when it is one they may see (``listing``). None otherwise (answered
    as not found); a revoke of a grant that exists, but of another team, is recorded as refused."""
    grant = listing(user=user).filter(pk=grant_id).first()
    if grant is None:
        refuse_by_id(grant_id, by=user, code="not_found")
    return grant


@dataclass(frozen=True)
class Filters:
    state: str = ""  # "", or one of STATES
    team: str = ""  # a team's slug
    agent: str = ""  # an agent's name
    tool: str = ""  # a tool name


def listing(
    *, user: Any = None, agent: AgentClient | None = None, filters: Filters = Filters()
) -> GrantQuerySet:
    """Grants newest first: an agent's own, or those of the user's teams (every grant for a superuser)."""
    qs = Grant.objects.filter(agent=agent) if agent is not None else permissions.visible_grants(user)
    now = timezone.now()
    if filters.state == "active":
        qs = qs.active(now)
    elif filters.state == "expired":
        qs = qs.expired(now)
    elif filters.state == "revoked":
        qs = qs.revoked()
    if filters.team:
        qs = qs.filter(team__slug=filters.team)
    if filters.agent:
        qs = qs.filter(agent__name=filters.agent)
    if filters.tool:
        qs = qs.filter(tool=filters.tool)
    return (
        qs.select_related("agent", "server", "team", "granted_by", "revoked_by", "on_behalf_of")
        # Whether its grantor could make it now: an active grant whose grantor could not lets nothing through.
        .annotate(grantor_stands=ExpressionWrapper(grantor_stands(), output_field=BooleanField()))
        .order_by("-created_at", "-pk")
    )


# --- the dashboard's suggestion -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Suggestion:
    team: str
    server: str
    tool: str
    approvals: int
    days: int


# A slug the audit log's events name, the slug of the team that holds it now, and the event ids its claim
# covers (``TeamSlug``: from, and until exclusive; 0 and None for every event).
SlugClaim = tuple[str, str, int, int | None]


def suggestions(user: Any) -> list[Suggestion]:
    """Tools whose gate one of the user's teams approved at least ELICIT_GRANT_SUGGEST_APPROVALS times in the
    last ELICIT_GRANT_SUGGEST_DAYS days, and never declined in them: candidates for a grant.

    A team's decisions are the events of the slugs it holds (``TeamSlug``, as ``visible_audit_events`` reads
    them): those of a slug it held before count as its own, and a slug another team held first counts only
    for this team's time, never for the other's decisions."""
    claims = TeamSlug.objects.filter(team__isnull=False)
    if not user.is_superuser:
        claims = claims.filter(team__in=permissions.reviewer_teams(user))
    held: list[SlugClaim] = list(claims.values_list("slug", "team__slug", "from_id", "until_id"))
    if not held:
        return []
    days = settings.ELICIT_GRANT_SUGGEST_DAYS
    return [
        Suggestion(row["team_now"], row["server_slug"], row["tool"], row["approved"], days)
        for row in suggestion_query(held)
    ]


def _claimed(slug: str, from_id: int, until_id: int | None) -> Q:
    """The events a claim on `slug` covers."""
    events = Q(team_slug=slug)
    if from_id > 0:
        events &= Q(id__gte=from_id)
    if until_id is not None:
        events &= Q(id__lt=until_id)
    return events


def suggestion_query(teams: Sequence[str | SlugClaim] | None) -> QuerySet[AuditEvent, dict[str, Any]]:
    """One query over the audit log's gate decisions of the window (a partial index holds exactly those),
    grouped by team (``team_now``), server and tool. ``teams``: the slugs' claims (a bare slug: held by the
    team of that slug for every event), None for every slug as the events name it."""
    decisions = AuditEvent.objects.filter(
        verb__in=["gate.approved", "gate.declined"],
        at__gte=timezone.now() - timedelta(days=settings.ELICIT_GRANT_SUGGEST_DAYS),
    )
    team_now: Any = F("team_slug")
    if teams is not None:
        claims = [(team, team, 0, None) if isinstance(team, str) else team for team in teams]
        whole: dict[str, list[str]] = {}  # the team's slug now -> the slugs it holds for every event
        parts: list[tuple[Q, str]] = []
        for slug, team, from_id, until_id in claims:
            if from_id <= 0 and until_id is None:
                whole.setdefault(team, []).append(slug)
            else:
                parts.append((_claimed(slug, from_id, until_id), team))
        scope = Q(team_slug__in=[slug for slugs in whole.values() for slug in slugs])
        for part, _team in parts:
            scope |= part
        decisions = decisions.filter(scope)
        if parts or any(slugs != [team] for team, slugs in whole.items()):
            # A team's earlier slug, or a slug held only for a time: each event is counted for its team.
            cases = [When(team_slug__in=slugs, then=Value(team)) for team, slugs in whole.items()]
            cases += [When(part, then=Value(team)) for part, team in parts]
            team_now = Case(*cases, default=Value(""), output_field=CharField())
    return (
        decisions.annotate(team_now=team_now)
        .values("team_now", "server_slug", "tool")
        .annotate(
            approved=Count("id", filter=Q(verb="gate.approved")),
            declined=Count("id", filter=Q(verb="gate.declined")),
        )
        .filter(approved__gte=settings.ELICIT_GRANT_SUGGEST_APPROVALS, declined=0)
        .order_by("-approved", "team_now", "server_slug", "tool")[:20]
    )
