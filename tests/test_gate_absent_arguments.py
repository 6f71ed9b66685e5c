"""A gate rule's condition on an argument the call leaves out. `environment != "staging"` stops every
deploy but staging's; a call that names no environment runs wherever the server's default sends it, which
the hub cannot see, so the gate stops it too. A grant's conditions read the same absence the other way: a
grant for `environment != "production"` does not cover a call that names none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from approvals import rules
from approvals.models import RoutingRule
from approvals.services import gates, grants
from tests import factories

NOT_STAGING = [{"argument": "environment", "op": "!=", "value": "staging"}]
NOT_PRE_PROD = [{"argument": "environment", "op": "not in", "value": ["staging", "qa"]}]


@pytest.fixture
def world(db: None) -> Any:
    release = factories.team("release")
    return factories.server(default_team=release), release


def _gate(world: Any, conditions: list[dict[str, Any]]) -> RoutingRule:
    server, team = world
    return RoutingRule.objects.create(
        position=1, name="all but staging", server=server, gate=True, team=team, conditions=conditions
    )


@pytest.mark.parametrize("conditions", [NOT_STAGING, NOT_PRE_PROD], ids=["!=", "not in"])
def test_a_call_naming_no_environment_is_stopped_by_a_rule_that_lets_only_staging_through(
    world: Any, conditions: list[dict[str, Any]]
) -> None:
    gate = _gate(world, conditions)
    server, _ = world
    matched, explanation = gates.gate_rule(factories.call(server, arguments={"branch": "main"}))
    assert matched == gate
    assert "environment is not given" in explanation["checked"][0]["why"]


def test_a_call_naming_the_environment_the_rule_lets_through_is_not_stopped(world: Any) -> None:
    _gate(world, NOT_STAGING)
    server, _ = world
    assert gates.gate_rule(factories.call(server, arguments={"environment": "staging"}))[0] is None
    assert gates.gate_rule(factories.call(server, arguments={"environment": "production"}))[0] is not None


def test_a_routing_rule_and_a_grant_do_not_read_an_absent_argument_as_a_match() -> None:
    subject = rules.Subject(server_slug="deploy", tool="deploy", mode="form", arguments={}, annotations={})
    assert not rules.evaluate(_rule(gate=False), subject).matched
    assert rules.evaluate(_rule(gate=True), subject).matched
    assert not grants._conditions_hold(NOT_STAGING, {"branch": "main"})
    assert grants._conditions_hold(NOT_STAGING, {"environment": "qa"})


def _rule(*, gate: bool) -> Any:
    return SimpleNamespace(
        enabled=True,
        server_id=None,
        server=None,
        tool_pattern="*",
        mode="",
        destructive=None,
        read_only=None,
        open_world=None,
        conditions=NOT_STAGING,
        gate=gate,
    )
