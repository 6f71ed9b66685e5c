"""What the gate's audit events keep of an edit: which arguments a reviewer changed, never the value of a
secret-looking one (by its name, as the audit log redacts everywhere, or by the tool's inputSchema, as the
answer's own ``input.answered`` does), while the call itself carries the edited arguments to the server.
On the real database."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from approvals.audit import core as audit
from approvals.models import AuditEvent, InputRequest, McpServer, Membership, Round, RoutingRule, ToolCall
from approvals.services import calls, gate_decisions, tokens
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def gated() -> dict[str, Any]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[
            {
                "name": "push",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "bucket": {"type": "string"},
                        "api_key": {"type": "string"},
                        "passphrase": {"type": "string", "description": "The signing password"},
                        "config": {"type": "object"},
                    },
                },
            }
        ],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(name="pushes", server=server, tool_pattern="push", gate=True, team=release)
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    return {"alice": alice, "agent": agent}


ASKED = {
    "bucket": "logs",
    "api_key": "sk-live-OLD",
    "passphrase": "hunter2-OLD",
    "config": {"token": "tok-OLD", "region": "eu"},
}
EDITED = {
    "bucket": "tmp",
    "api_key": "sk-live-NEW",
    "passphrase": "hunter2-NEW",
    "config": {"token": "tok-NEW", "region": "us"},
}


def test_the_gate_edited_event_names_the_changes_but_keeps_no_secret_value(gated) -> None:
    call, _ = calls.call_submit(agent=gated["agent"], server_slug="deploy", tool="push", arguments=ASKED)
    ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
    gate_decisions.gate_decide(input_request_id=ir.pk, user=gated["alice"], decision="edit", arguments=EDITED)

    call.refresh_from_db()
    assert call.status == ToolCall.Status.QUEUED and call.arguments == EDITED  # the server gets them all
    decided = AuditEvent.objects.filter(call_id=call.pk, verb__startswith="gate.")
    assert {event.verb for event in decided} == {"gate.opened", "gate.edited", "gate.approved"}
    stored = " ".join(str(event.data) for event in decided)
    for secret in ("sk-live", "hunter2", "tok-OLD", "tok-NEW"):
        assert secret not in stored, f"{secret} reached the audit log"

    edited = AuditEvent.objects.get(call_id=call.pk, verb="gate.edited")
    assert edited.actor_label == "alice"
    by_path = {change["path"]: change for change in edited.data["diff"]}
    assert set(by_path) == {"bucket", "api_key", "passphrase", "config"}
    assert by_path["bucket"] == {"path": "bucket", "op": "changed", "from": "logs", "to": "tmp"}
    assert by_path["api_key"]["from"] == by_path["api_key"]["to"] == audit.REDACTED
    assert by_path["passphrase"]["from"] == by_path["passphrase"]["to"] == audit.REDACTED
    assert by_path["config"]["from"] == {"token": audit.REDACTED, "region": "eu"}
    assert by_path["config"]["to"] == {"token": audit.REDACTED, "region": "us"}
