"""A gate's second look holds whichever way its approval is posted: the gate is judged by the tool definition
its approval is bound to (the gate's own), not by the server's tool list as it reads now."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals import second_look
from approvals.models import InputRequest, McpServer, Membership, RoutingRule, ToolCall
from approvals.services import calls
from tests import factories

pytestmark = pytest.mark.django_db

DESTRUCTIVE = {
    "name": "scale",
    "inputSchema": {
        "type": "object",
        "properties": {"replicas": {"type": "integer"}},
        "required": ["replicas"],
    },
    "annotations": {"destructiveHint": True},
}


def _gate(client: Client, tool: dict[str, Any] = DESTRUCTIVE) -> tuple[McpServer, ToolCall, InputRequest]:
    """A gate on a tool its server called destructive when the call was stopped (or `tool`); alice
    reviews it."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    deploy.tools = [tool]
    deploy.tools_fetched_at = timezone.now()
    deploy.save()
    RoutingRule.objects.create(name="scaling", server=deploy, tool_pattern="scale", gate=True, team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    call, _ = calls.call_submit(
        agent=agent, server_slug="deploy", tool="scale", arguments={"replicas": 2, "zone": "eu"}
    )
    client.force_login(alice)
    return deploy, call, InputRequest.objects.get(round__call=call, key="gate")


def _server_now_says_harmless(deploy: McpServer) -> None:
    deploy.tools = [{**DESTRUCTIVE, "annotations": {}}]
    deploy.save(update_fields=["tools"])


def test_a_gate_is_judged_by_its_own_tool_not_the_servers_list_as_it_reads_now(client: Client) -> None:
    deploy, _call, gate = _gate(client)
    _server_now_says_harmless(deploy)
    gate = InputRequest.objects.select_related("round__call__server", "policy").get(pk=gate.pk)

    assert second_look.reasons(gate, gate.round.call) == [
        "the server says this tool may make destructive changes"
    ]


def test_a_gate_posted_to_the_answer_form_is_not_sent_without_its_second_look(client: Client) -> None:
    deploy, call, gate = _gate(client)
    _server_now_says_harmless(deploy)

    forged: Any = client.post(f"/requests/{gate.pk}/respond/", {"action": "accept", "f-replicas": "300"})

    assert forged.status_code == 400
    gate.refresh_from_db()
    call.refresh_from_db()
    assert gate.status == InputRequest.Status.PENDING
    assert call.arguments == {"replicas": 2, "zone": "eu"}
    # Its own page still asks for the look, and sends once it is taken.
    review = client.post(f"/requests/{gate.pk}/decide/", {"decision": "approve"})
    assert review.status_code == 200 and "Check before sending" in review.text
    assert (
        client.post(f"/requests/{gate.pk}/decide/", factories.second_look_fields(review.text)).status_code
        == 302
    )
    gate.refresh_from_db()
    assert gate.status == InputRequest.Status.ANSWERED and gate.action == InputRequest.Action.ACCEPT


def test_a_request_that_is_no_gate_is_judged_by_the_servers_list(client: Client) -> None:
    deploy, _call, gate = _gate(client)
    other = factories.open_round(factories.call(deploy, tool="scale"), team_=gate.team)
    ir = InputRequest.objects.select_related("round__call__server", "policy").get(round=other)

    assert second_look.reasons(ir, ir.round.call) == [
        "the server says this tool may make destructive changes"
    ]
    _server_now_says_harmless(deploy)
    ir = InputRequest.objects.select_related("round__call__server", "policy").get(round=other)
    assert second_look.reasons(ir, ir.round.call) == []


def test_a_gate_posted_to_the_answer_form_is_refused_and_keeps_its_arguments(client: Client) -> None:
    """The answer form's route read a gate's approval as a form of its tool's inputSchema: the arguments
    the schema does not describe were dropped ({"replicas": 2, "zone": "eu"} went out as {"replicas": 300}).
    Only the gate's own form decides it."""
    _deploy, call, gate = _gate(client, {**DESTRUCTIVE, "annotations": {"destructiveHint": False}})

    for posted in ({"action": "accept", "f-replicas": "300"}, {"action": "decline", "reason": "no"}):
        response = client.post(f"/requests/{gate.pk}/respond/", posted)
        assert response.status_code == 400
        assert "Decide this call with its own buttons." in response.text
    gate.refresh_from_db()
    call.refresh_from_db()
    assert gate.status == InputRequest.Status.PENDING
    assert call.arguments == {"replicas": 2, "zone": "eu"}
