"""A rule's condition means what its author meant or is refused: a key the hub does not know or a missing
value is a field error in the admin, not a silent ``== null`` that never matches. A gate rule whose stored
condition the hub cannot read stops the call for a person instead of letting it go unapproved."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals import rules
from approvals.models import InputRequest, McpServer, Membership, RoutingRule, ToolCall
from approvals.services import calls, tokens
from tests import factories
from tests.test_cfgrev_rule_conditions import ADD, form


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ({"argument": "env", "op": "==", "val": "prod"}, "unknown keys val"),
        ({"argument": "env", "op": "in", "values": ["prod"]}, "unknown keys values"),
        ({"argument": "env", "op": "=="}, "== needs a value"),
        ({"argument": "env", "op": "!="}, "!= needs a value"),
        ({"argument": "env"}, "== needs a value"),
    ],
)
def test_a_condition_with_an_unknown_key_or_no_value_is_malformed(condition: dict, problem: str) -> None:
    assert problem in rules.check_condition(condition)


@pytest.mark.parametrize(
    "condition",
    [
        {"argument": "env", "op": "exists"},
        {"argument": "env", "value": "prod"},
        {"argument": "env", "op": "==", "value": None},
        {"argument": "env", "op": "not in", "value": []},
    ],
)
def test_well_formed_conditions_stay_well_formed(condition: dict) -> None:
    assert rules.check_condition(condition) == ""


@pytest.mark.django_db
def test_the_admin_refuses_a_gate_rule_whose_value_key_is_misspelt(admin_client: Client) -> None:
    typo = json.dumps([{"argument": "environment", "op": "==", "val": "production"}])
    page = admin_client.post(ADD, form(typo, gate="on"))
    assert page.status_code == 200
    assert "unknown keys val" in page.text
    assert not RoutingRule.objects.exists()


def _rule(gate: bool, conditions: list[Any]) -> SimpleNamespace:
    return SimpleNamespace(
        enabled=True,
        server_id=None,
        server=None,
        tool_pattern="*",
        mode="",
        destructive=None,
        read_only=None,
        open_world=None,
        conditions=conditions,
        gate=gate,
    )


SUBJECT = rules.Subject("deploy", "wipe", "", {"environment": "production"})
MALFORMED = [{"argument": "environment", "op": "~", "value": "production"}]


def test_a_malformed_condition_stops_the_call_at_a_gate_rule_and_matches_no_routing_rule() -> None:
    gate = rules.evaluate(_rule(True, MALFORMED), SUBJECT)
    assert gate.matched is True and "malformed condition" in gate.why and "stops the call" in gate.why
    routing = rules.evaluate(_rule(False, MALFORMED), SUBJECT)
    assert routing.matched is False and "malformed condition" in routing.why


def test_the_other_conditions_of_a_gate_rule_still_decide() -> None:
    conditions = [*MALFORMED, {"argument": "environment", "op": "==", "value": "staging"}]
    assert rules.evaluate(_rule(True, conditions), SUBJECT).matched is False


@pytest.mark.django_db
def test_a_call_a_gate_rule_with_a_stored_malformed_condition_matches_waits_for_a_person() -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[{"name": "wipe", "inputSchema": {"type": "object"}}],
        tools_fetched_at=timezone.now(),
        default_team=release,
    )
    # Stored behind the admin's back (a fixture, raw SQL): the admin would refuse it.
    RoutingRule.objects.create(
        position=1,
        name="production wipes",
        server=server,
        tool_pattern="wipe",
        conditions=[{"argument": "env", "op": "==", "val": "prod"}],
        gate=True,
        team=release,
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    call, _ = calls.call_submit(agent=agent, server_slug="deploy", tool="wipe", arguments={"env": "prod"})
    assert call.status == ToolCall.Status.AWAITING_INPUT
    ir = InputRequest.objects.get(round__call=call)
    assert "malformed condition" in json.dumps(ir.routing)
