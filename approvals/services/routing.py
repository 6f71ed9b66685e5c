"""Routing an input request when its round opens: the first matching rule names the team and the policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from approvals import rules
from approvals.models import AuditEvent, InputRequest, McpServer, Policy, RoutingRule, Team, ToolCall
from approvals.prepared import PreparedRead


@dataclass
class Route:
    team: Team | None
    policy: Policy | None
    rule: RoutingRule | None
    explanation: dict[str, Any] = field(default_factory=dict)
    assignee: Any = None
    warnings: list[str] = field(default_factory=list)
    for_requester: bool = False  # passed through to the agent's own MCP client
    # A url-mode request made for a person who can no longer open it (deleted or deactivated): why. It ends
    # as it opens (`rounds.GONE_HANDLERS`), instead of waiting for them or falling to their team.
    gone: str = ""

    @property
    def approvals_required(self) -> int:
        """The policy's count, but one for a request only one person may answer: a url-mode request made for
        its assignee, or one passed through to the requester. No second approval could ever come."""
        if self.policy is None or self.assignee is not None or self.for_requester:
            return 1
        return self.policy.approvals_required


ASSIGNEE_DELETED = "the person it was made for was deleted"
ASSIGNEE_DEACTIVATED = "the person it was made for was deactivated"


def _deleted_person(call: ToolCall) -> str:
    """The username the call was made on behalf of, when that user was deleted since (the call's
    on_behalf_of set to null); its submission's audit event names them. "" for a call made for no one."""
    named = AuditEvent.objects.filter(call_id=call.pk, verb="call.submitted").values_list(
        "data__on_behalf_of", flat=True
    )[:1]
    person = next(iter(named), None)
    return person if isinstance(person, str) else ""


def passthrough_refusal(call: ToolCall, mode: str) -> str:
    """Why a request a rule gives to the requester still goes to the team ("" when it may pass through)."""
    client = call.agent_client if isinstance(call.agent_client, dict) else None
    if client is None:
        return "the call did not come through /mcp, so the hub cannot reach the agent's client"
    modes = client.get("modes") or []
    if not modes:
        return "the agent's MCP client did not declare the elicitation capability"
    if mode not in modes:
        return f"the agent's MCP client did not declare elicitation in {mode} mode"
    return ""


# Read for every round the hub routes; compiled once per process. A rule names its server by slug: the
# server's stored JSON (its tool list, its probe, its credentials) stays unread.
_ROUTING_RULES = PreparedRead(
    lambda: (
        RoutingRule.objects.filter(gate=False)
        .select_related("server", "team", "policy")
        .defer(*McpServer.stored_json("server"))
    )
)


def route_all(*, call: ToolCall, requests: Sequence[InputRequest]) -> list[Route]:
    """The route of each of a round's requests, in order. The rules are read once for the whole round."""
    if not requests:
        return []
    ordered = list(_ROUTING_RULES())
    # Read once, and only for a round with a link to open and no person on the call.
    asks_url = any(ir.mode == InputRequest.Mode.URL for ir in requests)
    deleted = _deleted_person(call) if asks_url and not call.on_behalf_of_id else ""
    return [_route(call, ir, ordered, deleted) for ir in requests]


def _route(call: ToolCall, ir: InputRequest, ordered: Sequence[RoutingRule], deleted: str = "") -> Route:
    subject = rules.Subject(
        server_slug=call.server_slug,
        tool=call.tool,
        mode=ir.mode,
        arguments=call.arguments or {},
        annotations=call.tool_annotations,
    )
    checked = []
    chosen: Route | None = None
    made_for: str | None = None
    # Gate rules decide whether a call is sent at all (services.gates); they do not route questions.
    for rule in ordered:
        verdict = rules.evaluate(rule, subject)
        checked.append(
            {"rule": rule.name, "position": rule.position, "matched": verdict.matched, "why": verdict.why}
        )
        if verdict.matched:
            chosen = Route(rule.team, rule.policy, rule)
            break
    answered_by = RoutingRule.AnsweredBy.TEAM
    refused = ""
    if (
        chosen is not None
        and chosen.rule is not None
        and chosen.rule.answered_by == RoutingRule.AnsweredBy.REQUESTER
    ):
        refused = passthrough_refusal(call, ir.mode)
        if not refused:
            chosen.for_requester = True
            answered_by = RoutingRule.AnsweredBy.REQUESTER
    if chosen is None:
        team = call.server.default_team if call.server else None
        chosen = Route(team, None, None)
        checked.append(
            {
                "rule": "default",
                "position": None,
                "matched": True,
                "why": f"no rule matched: the server's team ({team.slug if team else 'staff'})",
            }
        )
    if ir.mode == InputRequest.Mode.URL:
        # The spec wants the URL opened by the person it was made for.
        if call.on_behalf_of_id:
            chosen.assignee = call.on_behalf_of
            if not chosen.assignee.is_active:
                chosen.gone = ASSIGNEE_DEACTIVATED
        elif deleted:
            # Made for them all the same: the link is not their team's to open.
            chosen.gone, made_for = ASSIGNEE_DELETED, deleted
        else:
            chosen.warnings.append("url_for_unknown_person")
    chosen.explanation = {
        "matched": chosen.rule.name if chosen.rule else "default",
        "team": chosen.team.slug if chosen.team else None,
        "policy": chosen.policy.name if chosen.policy else None,
        "assignee": chosen.assignee.get_username() if chosen.assignee else made_for,
        "annotations": subject.annotations,
        "checked": checked,
        "answered_by": answered_by,
    }
    if refused:
        chosen.explanation["passthrough_refused"] = f"The rule says the requester answers, but {refused}."
    return chosen
