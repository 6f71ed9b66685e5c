"""The audit of configuration: MCP servers, agents and tokens, teams and members, routing rules, policies.

Every add, change and delete made in the admin (``approvals.admin.AuditedAdmin``), and what the management
commands and the token services do to these, appends one audit event in the change's own transaction: who
(the user, or the command as a system actor), the object (model label, pk, name; ``team_slug`` for a team's
own rows) and what changed, field by field as ``{"field", "old", "new"}`` (many-to-many fields as the sorted
names they hold). A secret field's value never leaves this module: ``SECRET_FIELDS`` names them per model
(and any field named like a secret counts as one), and the event says only ``{"field", "change": "set" |
"changed" | "cleared"}``; a digest, kept in memory, tells a changed secret from an unchanged one. A URL that
may carry credentials (``SHOWN_FIELDS``: a server's, ``?api_key=...``) is recorded as `urlsafety.shown` gives
it, with ``"hidden": "set" | "changed" | "cleared"`` when what that hides changed (so a new key is seen).

Only the admin, the commands and token creation call this: nothing on a request's or a send's path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router, transaction
from django.db.models.deletion import Collector
from django.utils import timezone
from django.utils.text import capfirst

from approvals import urlsafety
from approvals.audit import core as audit
from approvals.audit.core import REDACTED, Actor, redact
from approvals.models import (
    AgentClient,
    AuditEvent,
    Grant,
    McpServer,
    Membership,
    PersonalToken,
    Policy,
    RoutingRule,
    Team,
)

# The verb of each (model, what happened). A rule's change that switches its gate on or off (its `gate` or
# `enabled` flag) has a verb of its own; an agent's rotated token is recorded on the agent.
CONFIG_VERBS: dict[tuple[type[models.Model], str], str] = {
    (McpServer, "created"): "server.created",
    (McpServer, "changed"): "server.changed",
    (McpServer, "deleted"): "server.deleted",
    (AgentClient, "created"): "agent.created",
    (AgentClient, "changed"): "agent.changed",
    (AgentClient, "deleted"): "agent.deleted",
    (AgentClient, "rotated"): "token.rotated",
    (PersonalToken, "created"): "token.created",
    (PersonalToken, "changed"): "token.changed",
    (PersonalToken, "deleted"): "token.revoked",
    (Team, "created"): "team.created",
    (Team, "changed"): "team.changed",
    (Team, "deleted"): "team.deleted",
    (Membership, "created"): "membership.added",
    (Membership, "changed"): "membership.changed",
    (Membership, "deleted"): "membership.removed",
    (Policy, "created"): "policy.created",
    (Policy, "changed"): "policy.changed",
    (Policy, "deleted"): "policy.deleted",
    (RoutingRule, "created"): "rule.created",
    (RoutingRule, "changed"): "rule.changed",
    (RoutingRule, "gate_on"): "rule.gate_on",
    (RoutingRule, "gate_off"): "rule.gate_off",
    (RoutingRule, "deleted"): "rule.deleted",
}
AUDITED = frozenset(model for model, _ in CONFIG_VERBS)
# Recorded only as "set", "changed" or "cleared".
SECRET_FIELDS: dict[type[models.Model], frozenset[str]] = {
    McpServer: frozenset({"headers", "env"}),
    AgentClient: frozenset({"token_hash", "webhook_secret", "previous_webhook_secret"}),
    PersonalToken: frozenset({"token_hash"}),
    Team: frozenset({"chat_webhook_url"}),
}
# URLs that may carry credentials (query, userinfo): recorded as shown, what that hides only as a digest.
SHOWN_FIELDS: dict[type[models.Model], frozenset[str]] = {McpServer: frozenset({"url"})}
# What the hub writes itself (probes, tools, leases, last use, timestamps): not configuration.
IGNORED_FIELDS: dict[type[models.Model], frozenset[str]] = {
    McpServer: frozenset(
        {"probe", "probed_at", "discover", "tools", "tools_fetched_at", "stdio_holder", "created_at"}
    ),
    AgentClient: frozenset({"created_at", "last_used_at"}),
    PersonalToken: frozenset({"created_at", "last_used_at"}),
}
M = TypeVar("M", bound=models.Model)
_WORDS = {"gate_on": "switched its gate on", "gate_off": "switched its gate off", "rotated": "token rotated"}
_EMPTY: tuple[Any, ...] = (None, "", [], {})


@dataclass(frozen=True)
class State:
    """One object as the audit compares it: who it is, and its audited fields' values (a secret's as
    ``(held, digest)``, never the value; a URL of ``SHOWN_FIELDS`` as ``(shown, digest of its hidden
    parts)``)."""

    model: type[models.Model]
    pk: Any
    name: str
    team: str
    values: dict[str, Any]

    def ref(self) -> dict[str, Any]:
        return {"model": self.model._meta.label, "pk": self.pk, "name": self.name}

    def title(self) -> str:
        return f"{capfirst(str(self.model._meta.verbose_name))} “{self.name}” (#{self.pk})"


def state(obj: models.Model) -> State:
    """``obj`` as it is in memory (its many-to-many fields as stored)."""
    model = type(obj)
    values = {field.name: _value(obj, field, is_secret(model, field.name)) for field in _fields(model)}
    for name in SHOWN_FIELDS.get(model, ()):
        values[name] = _shown(values[name])
    return State(model, obj.pk, str(obj), _team_of(obj), values)


def stored(obj: models.Model) -> State | None:
    """``obj`` as stored now (read again: a form has already changed the instance), None if it is not."""
    if obj.pk is None:
        return None
    fresh = type(obj)._default_manager.filter(pk=obj.pk).first()
    return state(fresh) if fresh is not None else None


def stored_many(model: type[models.Model], pks: Sequence[Any]) -> dict[Any, State]:
    if not pks:
        return {}
    return {obj.pk: state(obj) for obj in model._default_manager.filter(pk__in=pks)}


def saved(obj: models.Model, before: State | None, *, actor: Actor, what: str = "") -> AuditEvent | None:
    """Record that ``obj`` was created (``before`` None) or changed since ``before``; a change that
    changed nothing is not recorded."""
    after = state(obj)
    changes = _changes(before, after)
    if before is None:
        what = what or "created"
    elif not changes:
        return None
    elif not what:
        what = _gate_switch(before, after) or "changed"
    return _record(what, after, changes, actor=actor)


def get_or_create(
    model: type[M], *, actor: Actor, defaults: dict[str, Any] | None = None, **lookup: Any
) -> tuple[M, bool]:
    """``get_or_create``, audited when it creates."""
    with transaction.atomic():
        obj, made = model._default_manager.get_or_create(defaults=defaults, **lookup)
        if made:
            saved(obj, None, actor=actor)
    return obj, made


def update_or_create(
    model: type[M],
    *,
    actor: Actor,
    defaults: dict[str, Any],
    create_defaults: dict[str, Any] | None = None,
    **lookup: Any,
) -> tuple[M, bool]:
    """``update_or_create``, audited: created, or what it changed."""
    with transaction.atomic():
        existing = model._default_manager.select_for_update().filter(**lookup).first()
        before = state(existing) if existing is not None else None
        obj, made = model._default_manager.update_or_create(
            defaults=defaults, create_defaults=create_defaults, **lookup
        )
        saved(obj, before, actor=actor)
    return obj, made


def deleted(before: State, *, actor: Actor, via: Sequence[State] = ()) -> AuditEvent:
    return _record("deleted", before, _changes(before, None), actor=actor, via=via)


@contextmanager
def deleting(objs: Sequence[models.Model], *, actor: Actor) -> Iterator[None]:
    """Record the deletion of ``objs`` (done in the block), and of the audited rows it takes along (a
    team's memberships and rules, a server's rules) or changes (a policy's escalation team set to null)."""
    if not objs:
        yield
        return
    with transaction.atomic(using=router.db_for_write(type(objs[0]))):
        gone = [state(obj) for obj in objs]
        taken, touched, grants = _fallout(objs)
        yield
        for before in gone:
            deleted(before, actor=actor)
        for before in taken:
            deleted(before, actor=actor, via=gone)
        grants_ended(grants, actor=actor, via=gone)
        for before in touched:
            row = before.model._default_manager.filter(pk=before.pk).first()
            after = state(row) if row is not None else None
            if after is not None and (changes := _changes(before, after)):
                _record("changed", after, changes, actor=actor, via=gone)


def is_secret(model: type[models.Model], name: str) -> bool:
    """Listed in SECRET_FIELDS, or named like what the audit log redacts anyway (``token``, ``secret``...)."""
    return name in SECRET_FIELDS.get(model, ()) or redact({name: True})[name] == REDACTED


@cache
def _fields(model: type[models.Model]) -> tuple[Any, ...]:
    """The fields the audit compares: concrete ones but the pk, and many-to-many ones with no model of
    their own between (a team's members are Membership rows, audited as such)."""
    ignored = IGNORED_FIELDS.get(model, frozenset())
    concrete = [field for field in model._meta.concrete_fields if not field.primary_key]
    many = [field for field in model._meta.many_to_many if _through_is_automatic(field)]
    return tuple(field for field in [*concrete, *many] if field.name not in ignored)


def _through_is_automatic(field: Any) -> bool:
    return bool(field.remote_field.through._meta.auto_created)


def _value(obj: models.Model, field: Any, secret: bool) -> Any:
    if field.many_to_many:
        value: Any = sorted(str(item) for item in getattr(obj, field.name).all()) if obj.pk else []
    elif field.is_relation:
        related = getattr(obj, field.name)
        value = None if related is None else f"{related} (#{related.pk})"
    else:
        value = json.loads(json.dumps(field.value_from_object(obj), cls=DjangoJSONEncoder))
    if secret:
        return bool(value), hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
    return value


def _shown(url: Any) -> tuple[str, str] | None:
    """A URL as ``(shown, digest of its hidden parts or "")``; None when there is none."""
    if not url:
        return None
    hidden = urlsafety.hidden_parts(str(url))
    digest = hashlib.sha256(json.dumps(hidden).encode()).hexdigest() if hidden else ""
    return urlsafety.shown(str(url)), digest


def _team_of(obj: models.Model) -> str:
    if isinstance(obj, Team):
        return obj.slug
    if isinstance(obj, Membership | RoutingRule) and obj.team_id is not None:
        return obj.team.slug
    return ""


def _changes(before: State | None, after: State | None) -> list[dict[str, Any]]:
    """Field by field, old -> new; a secret as "set", "changed" or "cleared". None to empty is no change."""
    known = after or before
    assert known is not None
    changes: list[dict[str, Any]] = []
    for name in known.values:
        old = before.values.get(name) if before else None
        new = after.values.get(name) if after else None
        if old == new:
            continue
        if is_secret(known.model, name):
            held_old, held_new = bool(old and old[0]), bool(new and new[0])
            if held_old or held_new:
                change = "changed" if held_old and held_new else "set" if held_new else "cleared"
                changes.append({"field": name, "change": change})
        elif name in SHOWN_FIELDS.get(known.model, ()):
            changes.append(_shown_change(name, old, new))
        elif not (old in _EMPTY and new in _EMPTY):
            changes.append({"field": name, "old": old, "new": new})
    return changes


def _shown_change(name: str, old: tuple[str, str] | None, new: tuple[str, str] | None) -> dict[str, Any]:
    """A URL's change as shown (old -> new, which may read the same), and whether what it hides changed."""
    change: dict[str, Any] = {"field": name, "old": old[0] if old else None, "new": new[0] if new else None}
    hid_old, hid_new = old[1] if old else "", new[1] if new else ""
    if hid_old != hid_new:
        change["hidden"] = "changed" if hid_old and hid_new else "set" if hid_new else "cleared"
    return change


def _gate_switch(before: State, after: State) -> str:
    if before.model is not RoutingRule:
        return ""
    was = bool(before.values.get("gate") and before.values.get("enabled"))
    now = bool(after.values.get("gate") and after.values.get("enabled"))
    return "" if was == now else "gate_on" if now else "gate_off"


def _record(
    what: str, subject: State, changes: list[dict[str, Any]], *, actor: Actor, via: Sequence[State] = ()
) -> AuditEvent:
    message = f"{subject.title()} {_WORDS.get(what, what)}"
    if what not in {"created", "deleted"} and changes:
        message += ": " + ", ".join(_describe(change) for change in changes)
    if via:
        message += " with " + ", ".join(parent.title() for parent in via)
    data: dict[str, Any] = {"message": _short(message, 500), "object": subject.ref(), "changes": changes}
    if via:
        data["via"] = [parent.ref() for parent in via]
    return audit.record(
        actor=actor, verb=CONFIG_VERBS[subject.model, what], data=data, team_slug=subject.team
    )


def _describe(change: dict[str, Any]) -> str:
    if "change" in change:
        return f"{change['field']} {change['change']}"
    old, new = (_short(json.dumps(change[side], ensure_ascii=False), 60) for side in ("old", "new"))
    hidden = f" (its hidden part {change['hidden']})" if "hidden" in change else ""
    return f"{change['field']} {old} -> {new}{hidden}"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def active_grants(grants: models.QuerySet[Grant]) -> list[Grant]:
    """The grants of `grants` that let calls through now, read with what their end records names (before a
    deletion takes them)."""
    return list(grants.active(timezone.now()).select_related("server", "team"))  # type: ignore[attr-defined]


def grants_ended(grants: Sequence[Grant], *, actor: Actor, via: Sequence[State]) -> None:
    """Record the end of active `grants` that a deletion took along (a team's, a person's they were made
    for): ``grant.revoked`` as a reviewer's revoke records it, naming what was deleted with them. A grant is
    a standing approval: one that stops letting calls through is never silent in the history."""
    parents = ", ".join(parent.title() for parent in via)
    for grant in grants:
        message = f"Grant of {grant.tool} on {grant.server.slug} deleted with {parents}"
        audit.record(
            actor=actor,
            verb="grant.revoked",
            team_slug=grant.team.slug,
            data={
                **grant.audit_data(),
                "uses": grant.uses,
                "message": _short(message, 500),
                "via": [parent.ref() for parent in via],
            },
        )


def _fallout(objs: Sequence[models.Model]) -> tuple[list[State], list[State], list[Grant]]:
    """The audited rows deleting ``objs`` deletes too, and those it changes (on_delete=SET_NULL, or a
    many-to-many field that holds them: an agent's servers, the teams it may act for), as they are now; and
    the active grants it deletes. Django's own collector finds them, as the deletion will; other models'
    rows are never read."""
    collector = Collector(using=router.db_for_write(type(objs[0])))
    collector.collect(list(objs))
    origin = {(type(obj), obj.pk) for obj in objs}
    rows = [row for model, found in collector.data.items() if model in AUDITED for row in found]
    rows += [row for batch in collector.fast_deletes for row in _audited_rows(batch)]
    grant_pks = [row.pk for row in collector.data.get(Grant, ())]
    grant_pks += [
        pk
        for batch in collector.fast_deletes
        if isinstance(batch, models.QuerySet) and batch.model is Grant
        for pk in batch.values_list("pk", flat=True)
    ]
    grants = active_grants(Grant.objects.filter(pk__in=grant_pks)) if grant_pks else []
    taken = [state(row) for row in rows if (type(row), row.pk) not in origin]
    touched = [
        state(row)
        for (field, _), batches in collector.field_updates.items()
        if field.model in AUDITED
        for batch in batches
        for row in ([batch] if isinstance(batch, models.Model) else batch)
    ]
    return taken, touched + _holders(objs), grants


def _holders(objs: Sequence[models.Model]) -> list[State]:
    """The audited rows whose many-to-many fields (with no model of their own between) hold any of
    ``objs``: the deletion takes those links away without deleting the row or setting anything to null."""
    model = type(objs[0])
    return [
        state(row)
        for audited in sorted(AUDITED, key=lambda m: m._meta.label)
        for field in audited._meta.many_to_many
        if field.remote_field.model is model and _through_is_automatic(field)
        for row in audited._default_manager.filter(**{f"{field.name}__in": objs}).distinct()
    ]


def _audited_rows(batch: Any) -> list[models.Model]:
    """The rows of a fast delete's queryset, read only when they are audited."""
    return list(batch) if isinstance(batch, models.QuerySet) and batch.model in AUDITED else []
