"""Routing an input request when its round opens: the first matching rule names the team and the policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from approvals import rules
from approvals.models import InputRequest, Policy, RoutingRule, Team, ToolCall


@dataclass
class Route:
    team: Team | None
    policy: Policy | None
    rule: RoutingRule | None
    explanation: dict[str, Any] = field(default_factory=dict)
    assignee: Any = None
    warnings: list[str] = field(default_factory=list)


def route(*, call: ToolCall, ir: InputRequest) -> Route:
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
    for rule in RoutingRule.objects.filter(gate=False).select_related("server", "team", "policy"):
        verdict = rules.evaluate(rule, subject)
        checked.append(
            {"rule": rule.name, "position": rule.position, "matched": verdict.matched, "why": verdict.why}
        )
        if verdict.matched:
            chosen = Route(rule.team, rule.policy, rule)
            break
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
    }
    return chosen
