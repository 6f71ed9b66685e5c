"""A condition compares an argument with a value, and a server may read the value another way than JSON does:
the MCP Python SDK's servers (pydantic's lax mode) take ``1`` and ``"yes"`` for ``true`` and ``"0"`` for
``0`` and decode an object sent as JSON text, and many servers lower-case or trim a name before they use it.
A gate rule's ``==`` and ``in`` stop every such spelling of the value they name (a gate meant to stop
``environment == "production"`` is not passed by ``"Production "``), and still let unrelated values go; a
grant's ``!=`` and ``not in`` cover no such spelling of a value they exclude; a grant's ``==`` and a routing
rule's conditions compare as JSON does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.db import transaction

from approvals import rules
from approvals.models import Gate, RoutingRule, Team, ToolCall
from approvals.services import gates, grants, servers
from approvals.services.errors import Invalid
from tests import demo_support, factories
from tests.hub import Hub, set_up_hub


def _rule(conditions: list[dict[str, Any]], *, gate: bool) -> SimpleNamespace:
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


def _stops(condition: dict[str, Any], arguments: dict[str, Any]) -> bool:
    subject = rules.Subject("deploy", "create_deployment", "", arguments)
    return rules.evaluate(_rule([condition], gate=True), subject).matched


PRODUCTION = {"argument": "environment", "op": "==", "value": "production"}
FORCE = {"argument": "force", "op": "==", "value": True}
NO_REPLICAS = {"argument": "replicas", "op": "==", "value": 0}
LIVE = {"argument": "environment", "op": "in", "value": ["production", "dr"]}
NESTED = {"argument": "target.environment", "op": "==", "value": "production"}
FULL_WIDTH = "".join(chr(ord(char) + 0xFEE0) for char in "production")  # NFKC reads it as ASCII
PINNED = {"argument": "id", "op": "==", "value": 2**53 + 1}


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        (PRODUCTION, "Production"),
        (PRODUCTION, "production "),
        (PRODUCTION, " PRODUCTION\t"),
        (PRODUCTION, FULL_WIDTH),
        (PRODUCTION, "produ\u200bction"),  # a zero-width space
        (LIVE, "DR"),
        (FORCE, 1),
        (FORCE, 1.0),
        (FORCE, "true"),
        (FORCE, "Yes"),
        (NO_REPLICAS, "0"),
        (NO_REPLICAS, False),
        (NO_REPLICAS, -0.0),
        (PINNED, float(2**53)),  # the same double
    ],
)
def test_a_gate_rule_stops_a_value_a_lenient_server_reads_as_the_one_it_names(condition, value) -> None:
    assert _stops(condition, {condition["argument"]: value})


def test_a_gate_rule_stops_an_object_sent_as_json_text() -> None:
    assert _stops(NESTED, {"target": '{"environment": "production", "region": "eu"}'})
    assert _stops(
        {"argument": "target", "op": "==", "value": {"environment": "production", "zone": 1}},
        {"target": '{"zone": "1", "environment": "Production"}'},
    )
    assert not _stops(NESTED, {"target": '{"environment": "staging"}'})


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        (PRODUCTION, "staging"),
        (PRODUCTION, "production-eu"),
        (PRODUCTION, "prod uction"),
        (PRODUCTION, ["production"]),
        (LIVE, "qa"),
        (FORCE, 0),
        (FORCE, "no"),
        (FORCE, 2),
        (FORCE, None),
        (NO_REPLICAS, 1),
        (NO_REPLICAS, "zero"),
        (PINNED, 2**53 + 3),
        (PRODUCTION, float("nan")),
    ],
)
def test_a_gate_rule_lets_values_that_mean_something_else_go(condition, value) -> None:
    assert not _stops(condition, {condition["argument"]: value})


def test_a_gate_rules_not_equal_still_stops_every_other_spelling() -> None:
    not_staging = {"argument": "environment", "op": "!=", "value": "staging"}
    assert not _stops(not_staging, {"environment": "staging"})
    assert _stops(not_staging, {"environment": "Staging"})  # a person decides what the server makes of it
    assert _stops(not_staging, {"environment": "production"})


@pytest.mark.parametrize("value", ["Production", "production ", "PRODUCTION", FULL_WIDTH])
@pytest.mark.parametrize("op", ["!=", "not in"])
def test_a_grant_excluding_a_value_covers_none_of_its_spellings(value: str, op: str) -> None:
    excluded = "production" if op == "!=" else ["production"]
    condition = {"argument": "environment", "op": op, "value": excluded}
    assert not grants._conditions_hold([condition], {"environment": value})
    assert grants._conditions_hold([condition], {"environment": "staging"})
    with pytest.raises(Invalid):  # nor can one be made for such arguments
        grants.check_choice(
            {"for": "1h", "arguments": "conditions", "conditions": [condition]}, {"environment": value}
        )


def test_a_grants_equal_and_a_routing_rule_compare_as_json_does() -> None:
    assert not grants._conditions_hold([PRODUCTION], {"environment": "Production"})
    assert not grants._conditions_hold([FORCE], {"force": 1})
    assert grants._conditions_hold([FORCE], {"force": True})
    subject = rules.Subject("deploy", "create_deployment", "form", {"environment": "Production"})
    assert not rules.evaluate(_rule([PRODUCTION], gate=False), subject).matched


@pytest.mark.django_db
def test_a_call_naming_production_another_way_waits_at_the_gate() -> None:
    team = factories.team("release")
    server = factories.server(default_team=team)
    rule = RoutingRule.objects.create(
        position=1, name="production", server=server, gate=True, team=team, conditions=[PRODUCTION]
    )
    call = factories.call(server, arguments={"environment": "Production ", "branch": "main"})
    with transaction.atomic():
        assert gates.gate_on_submit(call) is True
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    gate = Gate.objects.get(call=call)
    assert gate.rule == rule
    why = gate.round.input_requests.get().routing["checked"][0]["why"]
    assert "as a lenient server reads it" in why
    other = factories.call(server, arguments={"environment": "staging"})
    with transaction.atomic():
        assert gates.gate_on_submit(other) is False


@pytest.mark.parametrize("value", [False, True, None])
def test_exists_with_a_value_is_refused_not_read_as_given(value: Any) -> None:
    """``{"op": "exists", "value": false}`` reads as "not given" to whoever writes it; it held for a call
    that gives the argument, so it is refused, as a rule or as a grant's condition."""
    condition = {"argument": "dry_run", "op": "exists", "value": value}
    assert "exists takes no value" in rules.check_condition(condition)
    subject = rules.Subject("deploy", "create_deployment", "", {"dry_run": 1})
    assert not rules.evaluate(_rule([condition], gate=False), subject).matched
    with pytest.raises(Invalid) as refused:
        grants.parse_choice({"for": "1h", "arguments": "conditions", "conditions": [condition]})
    assert "exists takes no value" in refused.value.fields["grant.conditions"]


@pytest.mark.parametrize(
    "name", ["environment ", " environment", "target..environment", "target.", ".target"]
)
def test_an_argument_name_no_call_can_give_is_refused(name: str) -> None:
    """A space around a name, or an empty part of a dotted one, names no argument: a gate rule written so
    stopped nothing, silently. It is refused; a stored one stops the calls the rule otherwise matches."""
    condition = {"argument": name, "op": "==", "value": "production"}
    assert "is not a name" in rules.check_condition(condition)
    subject = rules.Subject("deploy", "create_deployment", "", {"environment": "staging"})
    verdict = rules.evaluate(_rule([condition], gate=True), subject)
    assert verdict.matched
    assert "malformed condition" in verdict.why
    assert rules.check_condition({"argument": "deploy target.environment", "op": "exists"}) == ""


@pytest.fixture
def hub(worker: Any, demo_server: Any) -> Hub:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)
    return hub


@pytest.mark.timeout(180)
def test_on_the_real_stack_a_capitalised_environment_waits_and_reaches_no_server(
    hub: Hub, demo_server
) -> None:
    RoutingRule.objects.create(
        position=1,
        name="production deploys",
        server=hub.server,
        gate=True,
        team=Team.objects.get(slug="release"),
        conditions=[PRODUCTION],
    )
    call_id = hub.agent.call("create_deployment", {"branch": "main", "environment": "Production"})
    item = hub.reviewer.wait_for_request(call_id, "gate")
    assert item["gate"]["arguments"] == {"branch": "main", "environment": "Production"}
    assert hub.agent.get(f"/calls/{call_id}").json()["status"] == "awaiting_input"
    received = demo_support.recorded_requests(demo_server.url)
    assert [r for r in received if (r.get("body") or {}).get("method") == "tools/call"] == []
