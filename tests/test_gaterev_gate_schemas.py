"""A gate whose tool's inputSchema the hub cannot check against: a `$ref` it cannot resolve (a schema on the
network, which the hub never fetches; a pointer naming nothing) or one referring to itself without end. A
server may list such a tool; before, a reviewer's edit of its arguments ended in a 500 (REST and browser).
Now it counts as a broken schema: the edited arguments must be an object, and the call goes with them."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from approvals.models import Gate, InputRequest, McpServer, Membership, Policy, Round, RoutingRule
from approvals.services import calls, tokens
from approvals.services.gate_checks import schema_errors
from tests import factories
from tests.hub import Reviewer

pytestmark = pytest.mark.django_db

SCHEMAS = {
    "remote": {
        "type": "object",
        "properties": {"bucket": {"$ref": "https://schemas.example.com/bucket.json"}},
    },
    "nowhere": {"type": "object", "properties": {"bucket": {"$ref": "#/$defs/missing"}}},
    "anchor": {"type": "object", "properties": {"bucket": {"$dynamicRef": "#missing"}}},
    "endless": {
        "type": "object",
        "$defs": {"loop": {"$ref": "#/$defs/loop"}},
        "properties": {"bucket": {"$ref": "#/$defs/loop"}},
    },
}


def _gated(schema: dict[str, Any]) -> tuple[InputRequest, Reviewer]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[{"name": "wipe", "inputSchema": schema, "annotations": {"destructiveHint": True}}],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(
        name="wipes",
        server=server,
        tool_pattern="wipe",
        gate=True,
        team=release,
        policy=Policy.objects.create(name="one approval"),
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    call, _ = calls.call_submit(agent=agent, server_slug="deploy", tool="wipe", arguments={"bucket": "logs"})
    ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
    return ir, Reviewer(tokens.personal_token_create(user=alice)[1])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_an_edit_of_a_gate_whose_schema_cannot_be_resolved_is_decided_not_a_500(name: str) -> None:
    ir, alice = _gated(SCHEMAS[name])
    not_an_object = alice.post(f"/input-requests/{ir.pk}/decide", {"decision": "edit", "arguments": []})
    assert not_an_object.status_code in (400, 422), not_an_object.content
    edited = alice.post(
        f"/input-requests/{ir.pk}/decide", {"decision": "edit", "arguments": {"bucket": "tmp"}}
    )
    assert edited.status_code == 200, edited.content
    gate = Gate.objects.get(round=ir.round)
    assert gate.status == Gate.Status.APPROVED and gate.approved_arguments == {"bucket": "tmp"}


def test_a_schema_that_resolves_is_still_checked() -> None:
    schema = {
        "type": "object",
        "$defs": {"name": {"type": "string"}},
        "properties": {"bucket": {"$ref": "#/$defs/name"}},
    }
    assert schema_errors(schema, {"bucket": 7}) == {"bucket": "7 is not of type 'string'"}
    assert schema_errors(schema, {"bucket": "tmp"}) == {}
