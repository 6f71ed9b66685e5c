"""Every audit verb the hub writes, in one registry.

``record`` refuses a verb that is not here, and the audit page's event filter offers exactly these (and
"noun.*" for each noun), so a new kind of event is findable the day it is first written.
"""

from __future__ import annotations

VERBS: tuple[str, ...] = (
    # A call's life (hub-driven calls and relays)
    "call.submitted",
    "call.retry_scheduled",
    "call.completed",
    "call.failed",
    "call.expired",
    "call.cancelled",
    "call.outcome_discarded",
    "call.stop_sent",
    "call.held",
    "call.moved_to_session",
    "relay.submitted",
    "relay.answered",
    "relay.expired",
    # Rounds of input_required
    "round.opened",
    "round.answered",
    "round.resent",
    "round.gone",
    "round.extended",
    # One input request: routed, shown, answered, approved, escalated, expired
    "input.requested",
    "input.unsupported",
    "input.routed",
    "input.answered",
    "input.refused",
    "input.approved",
    "input.approvals_restarted",
    "input.escalated",
    "input.expired",
    # Gates: approval before a call is sent, bound to the exact call
    "gate.opened",
    "gate.approved",
    "gate.declined",
    "gate.edited",
    "gate.voided",
    "gate.used",
    # Remembered grants, and the gated calls they let through
    "gate.granted",
    "gate.grant_lapsed",
    "grant.created",
    "grant.revoked",
    "grant.refused",
    # Holder processes (handshake-era and stdio sessions)
    "holder.lost",
    # MCP servers
    "server.tools_refreshed",
    "server.probed",
    "server.stdio_leased",
    "server.stdio_restarted",
    # Configuration (approvals.services.config_audit): what the admin, the management commands and the
    # token services change, with the user or command that changed it; secrets only as set / cleared
    "server.created",
    "server.changed",
    "server.deleted",
    "agent.created",
    "agent.changed",
    "agent.deleted",
    "token.created",
    "token.changed",
    "token.rotated",
    "token.revoked",
    "team.created",
    "team.changed",
    "team.deleted",
    "membership.added",
    "membership.changed",
    "membership.removed",
    "policy.created",
    "policy.changed",
    "policy.deleted",
    "rule.created",
    "rule.changed",
    "rule.gate_on",
    "rule.gate_off",
    "rule.deleted",
    # The audit log itself
    "audit.exported",
    "audit.pruned",
)
NOUNS: tuple[str, ...] = tuple(sorted({verb.partition(".")[0] for verb in VERBS}))


def is_registered(verb: str) -> bool:
    return verb in _REGISTERED


def of_noun(noun: str) -> list[str]:
    """The registered verbs of one noun ("input" -> input.requested, input.routed, ...)."""
    return [verb for verb in VERBS if verb.partition(".")[0] == noun]


_REGISTERED = frozenset(VERBS)
