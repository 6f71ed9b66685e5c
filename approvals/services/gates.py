"""Gates: a routing rule with ``gate`` set stops a call for approval before anything is sent upstream.

A gate is a `Round` of kind GATE with one `InputRequest` (key ``gate``, method ``tools/call``; its schema is
the tool's ``inputSchema``), so teams, N-of-M, no self-approval, expiry, escalation, the inbox, the live
queues and the audit log treat it as they treat a server's question. Reviewers approve it, decline it with a
reason (the agent gets a tool error saying so), or edit the arguments (checked against ``inputSchema``); the
`Gate` row binds the approval to the exact call through `call_digest`.

At send time (`gate_at_send`, on the Celery path and the holder path) the digest is computed again over the
tool definition the hub holds (listed again first when older than `SEND_FRESHNESS` seconds,
`gate_refresh_tools`), the arguments to be sent, and the rule's and policy's current revisions. Equal: the
approval is used, once. Different: the approval is voided (``gate.voided``, with the reason) and a new gate
opens for the call as it now is. So too when the first gate rule matching the call as it would be sent asks
another team, or under another policy, than the rule that opened the gate (arguments a reviewer edited into a
stricter rule's reach, or a rule added before it since): that rule's reviewers decide it.

Remembered grants (``approvals.services.grants``, when installed) let a call through without a person. Before
such a call's first send the grant is checked again (the tool list listed again first when stale, as for an
approval): revoked, expired or deleted since, its grantor no longer able to make it, or the tool's definition
changed, and a gate opens for the call (``gate.grant_lapsed``).

A call its agent cancels while its gate waits for a decision, or is approved and not sent, ends that gate
``cancelled`` (`gate_withdraw`); a decision that comes after is refused.
"""

from __future__ import annotations

import functools
import importlib
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals import broadcast, canonical, rules
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import Gate, InputRequest, McpServer, Policy, Round, RoutingRule, ToolCall
from approvals.prepared import PreparedRead
from approvals.services import notifications
from approvals.services.errors import Conflict, Invalid
from approvals.services.gate_checks import (  # noqa: F401  (part of this module's interface)
    GATE_KEY,
    GATE_METHOD,
    MAX_ARGUMENTS,
    is_gate,
    schema_errors,
    validate_decision,
)
from approvals.services.rounds import _announce, last_round_number, round_ttl

SYSTEM = Actor.system()
SEND_FRESHNESS = 60  # seconds: a send is checked against a tool definition at most this old
TOOL_FIELDS = ("name", "description", "inputSchema", "outputSchema", "annotations")


def _grants() -> ModuleType | None:
    """The remembered-grants service, where installed (``approvals.services.grants``)."""
    try:
        return importlib.import_module("approvals.services.grants")
    except ModuleNotFoundError:
        return None


def grants_installed() -> bool:
    return _grants() is not None


# ---- what an approval covers -------------------------------------------------------------------------


def tool_definition(server: McpServer | None, tool: str) -> dict[str, Any]:
    """The tool as the hub holds it (from the stored tools/list): the parts an approval covers."""
    spec = (server.tool(tool) if server else None) or {"name": tool}
    return {key: spec[key] for key in TOOL_FIELDS if key in spec}


def call_digest(
    *,
    call: ToolCall,
    arguments: Any,
    tool: dict[str, Any],
    rule: RoutingRule | None,
    rule_revision: int | None,
    policy: Policy | None,
    policy_revision: int | None,
) -> str:
    """SHA-256 of the canonical JSON (RFC 8785) of everything an approval is bound to."""
    agent = call.agent
    person = call.on_behalf_of
    return canonical.digest(
        {
            "server": call.server_slug,
            "tool": tool,
            "arguments": arguments,
            "agent": {"id": agent.pk, "name": agent.name} if agent else None,
            "on_behalf_of": person.get_username() if person else None,
            "rule": {"id": rule.pk, "revision": rule_revision} if rule else None,
            "policy": {"id": policy.pk, "revision": policy_revision} if policy else None,
        }
    )


def _current_digest(call: ToolCall, gate: Gate) -> str:
    """The digest of the call as it would be sent now, under the rule and policy that required the gate."""
    rule = RoutingRule.objects.filter(pk=gate.rule_id).first() if gate.rule_id else None
    policy = Policy.objects.filter(pk=gate.policy_id).first() if gate.policy_id else None
    return call_digest(
        call=call,
        arguments=call.arguments or {},
        tool=tool_definition(call.server, call.tool),
        rule=rule,
        rule_revision=rule.revision if rule else None,
        policy=policy,
        policy_revision=policy.revision if policy else None,
    )


def arguments_diff(before: Any, after: Any) -> list[dict[str, Any]]:
    """What a reviewer changed, top-level argument by argument: ``[{"path", "op", "from", "to"}]``."""
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    changes: list[dict[str, Any]] = []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            changes.append({"path": key, "op": "removed", "from": before[key]})
        elif key not in before:
            changes.append({"path": key, "op": "added", "to": after[key]})
        elif canonical.canonical_json(before[key]) != canonical.canonical_json(after[key]):
            changes.append({"path": key, "op": "changed", "from": before[key], "to": after[key]})
    return changes


# ---- which rule gates a call ---------------------------------------------------------------------------


# Read for every call submitted; compiled once per process. A rule names its server by slug: the server's
# stored JSON (its tool list, its probe, its credentials) stays unread.
_GATE_RULES = PreparedRead(
    lambda: (
        RoutingRule.objects.filter(gate=True)
        .select_related("server", "team", "policy")
        .defer(*McpServer.stored_json("server"))
    )
)


def gate_rule(call: ToolCall) -> tuple[RoutingRule | None, dict[str, Any]]:
    """The first enabled gate rule matching the call (by position), and why each rule did or did not."""
    subject = rules.Subject(
        server_slug=call.server_slug,
        tool=call.tool,
        mode="",
        arguments=call.arguments or {},
        annotations=call.tool_annotations,
    )
    checked = []
    for rule in _GATE_RULES():
        verdict = rules.evaluate(rule, subject)
        checked.append(
            {"rule": rule.name, "position": rule.position, "matched": verdict.matched, "why": verdict.why}
        )
        if verdict.matched:
            explanation = {
                "matched": rule.name,
                "team": rule.team.slug,
                "policy": rule.policy.name if rule.policy else None,
                "assignee": None,
                "annotations": subject.annotations,
                "checked": checked,
                "gate": True,
            }
            return rule, explanation
    return None, {"checked": checked}


def _audit_data(call: ToolCall, ir: InputRequest | None, digest: str, **more: Any) -> dict[str, Any]:
    team = ir.team.slug if ir is not None and ir.team else None
    return {"server": call.server_slug, "tool": call.tool, "team": team, "digest": digest, **more}


# ---- opening a gate ------------------------------------------------------------------------------------


def gate_on_submit(call: ToolCall) -> bool:
    """Inside `call_submit`'s transaction: True when a gate (or ``None``: a grant) decides the call first.

    No gate rule matches: False, the call is queued as usual. A grant covers it: the grant is used and
    False. Otherwise a gate opens and True: the call is not queued until it is approved. A grant found but
    no longer usable (revoked, expired or its grantor removed since, ``grants.use``'s Conflict) is as none
    found: the agent's submit never fails on it, a person decides the call."""
    rule, explanation = gate_rule(call)
    if rule is None:
        return False
    grants = _grants()
    if grants is not None:
        digest = canonical.digest(tool_definition(call.server, call.tool))
        grant = grants.find(call=call, tool_digest=digest, rule=rule)
        if grant is not None:
            try:
                grants.use(grant, call)
            except Conflict:
                pass  # its own savepoint is rolled back: nothing of the use was recorded
            else:
                return False
    gate_open(call=call, rule=rule, explanation=explanation)
    return True


def _message(call: ToolCall) -> str:
    who = call.agent.name if call.agent else "An agent"
    person = f" for {call.on_behalf_of.get_username()}" if call.on_behalf_of else ""
    return f"{who} asks{person} to call {call.tool} on {call.server_name}."


def gate_open(*, call: ToolCall, rule: RoutingRule, explanation: dict[str, Any], why: str = "") -> Round:
    """Open a gate for the call as it is now. Runs inside the caller's transaction.

    Raises Invalid when the arguments have no canonical JSON form (an approval could not be bound to them)."""
    now = timezone.now()
    policy = rule.policy
    tool = tool_definition(call.server, call.tool)
    arguments = call.arguments or {}
    try:
        digest = call_digest(
            call=call,
            arguments=arguments,
            tool=tool,
            rule=rule,
            rule_revision=rule.revision,
            policy=policy,
            policy_revision=policy.revision if policy else None,
        )
    except canonical.CanonicalError as exc:
        raise Invalid(
            f"The arguments cannot be approved: they hold a value canonical JSON cannot represent ({exc}).",
            code="invalid_arguments",
            fields={"arguments": "not representable as canonical JSON"},
        ) from None
    number = last_round_number(call) + 1
    ttl = policy.ttl if policy and policy.ttl else round_ttl(call)
    rnd = Round.objects.create(
        call=call,
        number=number,
        kind=Round.Kind.GATE,
        raw={},
        request_state=None,
        opened_at=now,
        deadline=now + timedelta(seconds=ttl),
    )
    schema = tool.get("inputSchema")
    schema = schema if isinstance(schema, dict) else {"type": "object"}
    properties = schema.get("properties")
    ir = InputRequest.objects.create(
        round=rnd,
        key=GATE_KEY,
        method=GATE_METHOD,
        mode=InputRequest.Mode.FORM,
        message=_message(call),
        requested_schema=schema,
        property_order=list(properties) if isinstance(properties, dict) else [],
        params={"name": call.tool, "arguments": arguments},
        team=rule.team,
        policy=policy,
        rule=rule,
        routing=explanation,
        approvals_required=policy.approvals_required if policy else 1,
        created_at=now,
    )
    Gate.objects.create(
        round=rnd,
        call=call,
        rule=rule,
        rule_revision=rule.revision,
        policy=policy,
        policy_revision=policy.revision if policy else None,
        tool=tool,
        arguments=arguments,
        digest=digest,
        created_at=now,
    )
    ToolCall.objects.filter(pk=call.pk).update(
        status=ToolCall.Status.AWAITING_INPUT, holder=None, updated_at=now
    )
    call.status = ToolCall.Status.AWAITING_INPUT
    audit.record(
        actor=SYSTEM,
        verb="gate.opened",
        call=call,
        input_request=ir,
        data=_audit_data(
            call,
            ir,
            digest,
            round=number,
            rule=rule.name,
            rule_revision=rule.revision,
            policy=policy.name if policy else None,
            policy_revision=policy.revision if policy else None,
            approvals_required=ir.approvals_required,
            annotations=tool.get("annotations") or {},
            **({"reopened_because": why} if why else {}),
        ),
    )
    notifications.notify(ir=ir, team=ir.team, event="routed")
    transaction.on_commit(functools.partial(_announce, rnd.pk, call.pk, [ir]))
    transaction.on_commit(lambda: broadcast.call_changed(call))
    return rnd


# ---- withdrawn -----------------------------------------------------------------------------------------

# A gate the agent's cancel ends: still waiting for a decision, or approved and not sent.
WITHDRAWABLE = (Gate.Status.OPEN, Gate.Status.APPROVED)


def gate_withdraw_lock(*, call_id: Any, agent: Any) -> None:
    """Lock the gates of the agent's call that its cancel will end (`gate_withdraw`), before the call's lock:
    the order a decision (round, gate, call) and a send's claim (gate, call) take them in. The other way
    round, a cancel racing either deadlocked, and PostgreSQL aborted one of the two."""
    list(
        Gate.objects.filter(call_id=call_id, call__agent=agent, status__in=WITHDRAWABLE)
        .select_for_update(no_key=True, of=("self",))
        .values_list("pk", flat=True)
    )


def gate_withdraw(*, call: ToolCall, now: datetime) -> int:
    """The agent cancelled the call (`calls.call_cancel`, in its transaction, the call locked): a gate still
    waiting for a decision, or approved and not sent, ends ``cancelled``, so neither the agent's read of the
    call nor the pages show one still open; the call is never sent, and a decision that comes after is
    refused. Returns how many gates."""
    return Gate.objects.filter(call=call, status__in=WITHDRAWABLE).update(
        status=Gate.Status.CANCELLED,
        decided_at=Coalesce("decided_at", Value(now)),  # an approval's stays
    )


# ---- deciding ------------------------------------------------------------------------------------------


# ---- at send time ----------------------------------------------------------------------------------------


def gate_refresh_tools(call_id: Any) -> None:
    """Before the first send of a gated call, or of one a remembered grant let through (outside any
    transaction): list the server's tools again when the stored list is older than `SEND_FRESHNESS` seconds,
    so the send is checked against what the server claims now (`gate_at_send`), not against a list the
    server changed since."""
    from approvals.services.servers import server_refresh_if_stale

    gate = (
        Gate.objects.filter(call_id=call_id, status=Gate.Status.APPROVED)
        .select_related("call__server")
        .first()
    )
    call = (
        gate.call
        if gate is not None
        else ToolCall.objects.filter(pk=call_id, grant__isnull=False, started_at__isnull=True)
        .select_related("server")
        .first()
    )
    if call is None or call.server is None:
        return
    server_refresh_if_stale(call.server, max_age=SEND_FRESHNESS)


def _void_reason(call: ToolCall, gate: Gate) -> str:
    reasons = []
    now_tool = tool_definition(call.server, call.tool)
    if canonical.canonical_json(now_tool) != canonical.canonical_json(gate.tool):
        changed = sorted(
            key
            for key in TOOL_FIELDS
            if canonical.canonical_json(now_tool.get(key)) != canonical.canonical_json(gate.tool.get(key))
        )
        reasons.append(f"the tool's definition changed on the server ({', '.join(changed)})")
    # A gate opens under a rule (and its policy, when it has one, whose revision the gate keeps): a deletion
    # empties the gate's link to it (SET_NULL), so a link gone is a rule or policy deleted.
    rule = RoutingRule.objects.filter(pk=gate.rule_id).first() if gate.rule_id else None
    if rule is None:
        reasons.append("the rule that required the approval was deleted")
    elif rule.revision != gate.rule_revision:
        reasons.append(
            f"the rule {rule.name!r} was edited (revision {gate.rule_revision} -> {rule.revision})"
        )
    policy = Policy.objects.filter(pk=gate.policy_id).first() if gate.policy_id else None
    if policy is None and gate.policy_revision is not None:
        reasons.append("the policy that required the approval was deleted")
    elif policy is not None and policy.revision != gate.policy_revision:
        reasons.append(
            f"the policy {policy.name!r} was edited (revision {gate.policy_revision} -> {policy.revision})"
        )
    if canonical.canonical_json(call.arguments or {}) != canonical.canonical_json(
        gate.approved_arguments or {}
    ):
        reasons.append("the arguments are not the approved ones")
    return "; ".join(reasons) or "the call is not the one approved"


# Every first send reads it (most calls have no gate): compiled once per process.
_LATEST_GATE_LOCKED = PreparedRead(
    lambda call: (
        Gate.objects.filter(call=call)
        .exclude(status=Gate.Status.VOIDED)
        .order_by("-created_at", "-pk")
        .select_for_update(no_key=True)[:1]
    ),
    call=Gate._meta.get_field("call"),
)


def _grant_at_send(call: ToolCall) -> bool:
    """`gate_at_send` for a call a remembered grant let through at submit: True while the grant still covers
    it. Else (``gate.grant_lapsed``, with the reason) a gate opens for it, as when an approval is voided."""
    grants = _grants()
    digest = canonical.digest(tool_definition(call.server, call.tool))
    # The gate rule that stops the call now: the grant stands in only for a gate its team may decide alone.
    rule, explanation = gate_rule(call)
    reason = (
        "remembered grants are no longer installed"
        if grants is None
        else grants.lapsed(call=call, tool_digest=digest, rule=rule)
    )
    if reason is None:
        return True
    audit.record(
        actor=SYSTEM,
        verb="gate.grant_lapsed",
        call=call,
        data={"grant": str(call.grant_id), "server": call.server_slug, "tool": call.tool, "reason": reason},
    )
    if rule is None:
        # No gate rule asks for this call any more: it goes as it is, and a later retry of this send (a
        # transient fault) does not check the lapsed grant, nor audit it, again.
        ToolCall.objects.filter(pk=call.pk).update(grant=None)
        call.grant = None
        return True
    gate_open(call=call, rule=rule, explanation=explanation, why=reason)
    return False


def gate_at_send(call: ToolCall) -> bool:
    """Just before a gated call's first ``tools/call`` leaves, inside the claiming transaction: True when it
    may go. The approval is used once; a call that differs from what was approved (the tool's definition,
    the rule's or policy's revision, the arguments) voids it and opens a new gate (False)."""
    gate = _LATEST_GATE_LOCKED.first(call=call.pk)
    if gate is None and call.grant_id is not None:
        return _grant_at_send(call)
    if gate is None or gate.status == Gate.Status.USED:
        return True  # never gated; USED: the same send, retried before it left
    if gate.status != Gate.Status.APPROVED:
        return False
    now = timezone.now()
    current = _current_digest(call, gate)
    ir = gate.round.input_requests.select_related("team").first()
    rule, explanation = gate_rule(call)
    stopped_by = _other_gate(gate, rule)
    if current == gate.approved_digest and stopped_by is None:
        Gate.objects.filter(pk=gate.pk, status=Gate.Status.APPROVED).update(
            status=Gate.Status.USED, used_at=now
        )
        audit.record(
            actor=SYSTEM, verb="gate.used", call=call, input_request=ir, data=_audit_data(call, ir, current)
        )
        return True
    reason = stopped_by if current == gate.approved_digest and stopped_by else _void_reason(call, gate)
    Gate.objects.filter(pk=gate.pk).update(status=Gate.Status.VOIDED, reason=reason)
    audit.record(
        actor=SYSTEM,
        verb="gate.voided",
        call=call,
        input_request=ir,
        data=_audit_data(call, ir, gate.approved_digest, now_digest=current, reason=reason),
    )
    if rule is None:
        return True  # no gate rule asks for this call any more: it goes as it is
    gate_open(call=call, rule=rule, explanation=explanation, why=reason)
    return False


def _other_gate(gate: Gate, rule: RoutingRule | None) -> str | None:
    """Why the approval given at ``gate`` does not cover the call as it would be sent, whose first matching
    gate rule is now ``rule``: that rule asks another team, or under another policy (the arguments a
    reviewer approved, or a rule added or moved since, put the call under it). None when it is the gate's
    own rule, one asking the same team under the same policy, or no rule at all (nothing asks for an
    approval any more). Without this check, a reviewer's edit could send a call that a stricter rule
    (another team, two approvals) stops, on the first rule's approval."""
    if rule is None or rule.pk == gate.rule_id:
        return None
    if gate.rule_id is not None and gate.policy_id == rule.policy_id:
        own = RoutingRule.objects.filter(pk=gate.rule_id).values_list("team_id", flat=True).first()
        if own == rule.team_id:
            return None
    return f"the call as it would be sent falls under the rule {rule.name!r}, which asks its own approval"
