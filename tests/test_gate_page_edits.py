"""The gate page's forms as a stale or forged POST could send them, and who is offered a grant."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import Gate, InputRequest, McpServer, Membership, Round, RoutingRule
from approvals.services import calls, tokens
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def gated() -> Any:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    ops = factories.team("ops", (bob, Membership.Role.REVIEWER))
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}}
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[{"name": "scale", "inputSchema": schema}],
        tools_fetched_at=timezone.now(),
        default_team=release,
    )
    RoutingRule.objects.create(
        position=1, name="scales", server=server, tool_pattern="scale", gate=True, team=release
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    # Arguments the tool's own schema refuses (n over its maximum): the page can only offer the JSON editor.
    call, _ = calls.call_submit(agent=agent, server_slug="deploy", tool="scale", arguments={"n": 10})
    ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
    return alice, bob, ops, ir


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_form_edit_of_arguments_only_json_can_hold_is_refused_clearly(gated: Any) -> None:
    alice, _, _, ir = gated
    page = signed_in(alice).post(
        f"/requests/{ir.pk}/decide/", {"decision": "edit", "editor": "form", "f-n": "3"}
    )
    assert page.status_code == 422
    assert "These arguments can only be edited as JSON." in page.content.decode()
    assert Gate.objects.get(round=ir.round).status == Gate.Status.OPEN


def test_a_reviewer_the_gate_was_escalated_to_is_offered_no_grant(gated: Any) -> None:
    alice, bob, ops, ir = gated
    assert "grant_for" in signed_in(alice).get(f"/requests/{ir.pk}/").content.decode()
    InputRequest.objects.filter(pk=ir.pk).update(escalation_team=ops, escalated_at=timezone.now())

    page = signed_in(bob).get(f"/requests/{ir.pk}/")

    assert page.status_code == 200
    body = page.content.decode()
    assert "Approve and send as asked" in body
    assert "grant_for" not in body
