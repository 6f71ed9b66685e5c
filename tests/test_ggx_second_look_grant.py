"""A risky gate's second look restates the grant asked for with the approval, not only that there is one:
how long it lasts and which later calls it lets through (exactly these arguments, or the conditions), so a
reviewer who ticked "until revoked" or a broad condition sees it before "Confirm and send" makes it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import Grant, InputRequest, McpServer, Membership, Policy, RoutingRule
from approvals.services import calls, tokens
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def gate(client: Client) -> InputRequest:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[
            {
                "name": "scale",
                "inputSchema": {
                    "type": "object",
                    "properties": {"replicas": {"type": "integer"}, "service": {"type": "string"}},
                },
            }
        ],
        tools_fetched_at=timezone.now(),
        default_team=release,
    )
    RoutingRule.objects.create(
        name="scaling",
        server=server,
        tool_pattern="scale",
        gate=True,
        team=release,
        policy=Policy.objects.create(name="prod", risk=Policy.Risk.HIGH),
    )
    agent, _ = tokens.agent_create(name="ci-bot", servers=[server])
    call, _ = calls.call_submit(
        agent=agent, server_slug="deploy", tool="scale", arguments={"replicas": 2, "service": "api"}
    )
    client.force_login(alice)
    return InputRequest.objects.get(round__call=call, key="gate")


def restated(page: str) -> str:
    found = re.search(r"<div data-review-grant>(.*?)</div>", page, re.S)
    assert found, "the review does not restate the grant"
    return found.group(1)


def test_the_review_says_how_long_and_for_which_conditions(client: Client, gate: InputRequest) -> None:
    condition = json.dumps({"argument": "service", "op": "==", "value": "api"})
    review = client.post(
        f"/requests/{gate.pk}/decide/",
        {
            "decision": "approve",
            "grant_for": "until_revoked",
            "grant_arguments": "conditions",
            "grant_condition": condition,
        },
    )
    assert review.status_code == 200 and "Check before sending" in review.text
    said = restated(review.text)
    assert "until revoked" in said
    assert "with any arguments where all of these hold" in said
    assert "service == &quot;api&quot;" in said
    assert not Grant.objects.exists()


def test_an_exact_grant_is_restated_as_exact(client: Client, gate: InputRequest) -> None:
    review = client.post(
        f"/requests/{gate.pk}/decide/", {"decision": "approve", "grant_for": "1h", "grant_arguments": "exact"}
    )
    said = restated(review.text)
    assert "for 1 hour" in said and "with exactly these arguments" in said
    assert "data-review-grant-conditions" not in said


def test_no_grant_restates_none(client: Client, gate: InputRequest) -> None:
    review = client.post(f"/requests/{gate.pk}/decide/", {"decision": "approve", "grant_for": ""})
    assert review.status_code == 200 and "data-review-grant" not in review.text


def test_the_confirmed_review_makes_the_grant_restated(client: Client, gate: InputRequest) -> None:
    condition = json.dumps({"argument": "service", "op": "==", "value": "api"})
    chosen: dict[str, Any] = {
        "decision": "approve",
        "grant_for": "8h",
        "grant_arguments": "conditions",
        "grant_condition": condition,
    }
    review = client.post(f"/requests/{gate.pk}/decide/", chosen)
    assert "for 8 hours" in restated(review.text)
    done = client.post(f"/requests/{gate.pk}/decide/", factories.second_look_fields(review.text))
    assert done.status_code == 302
    made = Grant.objects.get()
    assert made.arguments_mode == "conditions" and made.conditions == [json.loads(condition)]
