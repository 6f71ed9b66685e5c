"""Routing an input request when its round opens: the first matching rule names the team and the policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from approvals import rules
from approvals.models import InputRequest, McpServer, Policy, RoutingRule, Team, ToolCall
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

    @property
    def approvals_required(self) -> int:
        """The policy's count, but one for a request only one person may answer: a url-mode request made for
        its assignee, or one passed through to the requester. No second approval could ever come."""
        if self.policy is None or self.assignee is not None or self.for_requester:
            return 1
        return self.policy.approvals_required


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
    return [_route(call, ir, ordered) for ir in requests]


def _route(call: ToolCall, ir: InputRequest, ordered: Sequence[RoutingRule]) -> Route:
    subject = rules.Subject(
        server_slug=call.server_slug,
        tool=call.tool,
        mode=ir.mode,
        arguments=call.arguments or {},
        annotations=call.tool_annotations,
    )
    checked = []
    chosen: Route | None = None
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
        else:
            chosen.warnings.append("url_for_unknown_person")
    chosen.explanation = {
        "matched": chosen.rule.name if chosen.rule else "default",
        "team": chosen.team.slug if chosen.team else None,
        "policy": chosen.policy.name if chosen.policy else None,
        "assignee": chosen.assignee.get_username() if chosen.assignee else None,
        "annotations": subject.annotations,
        "checked": checked,
        "answered_by": answered_by,
    }
    if refused:
        chosen.explanation["passthrough_refused"] = f"The rule says the requester answers, but {refused}."
    return chosen
