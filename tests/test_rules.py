"""Routing rules, pure: table-driven matching and the explanation kept for the call page."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from approvals import rules

DEPLOY = rules.Subject(
    server_slug="deploy",
    tool="create_deployment",
    mode="form",
    arguments={"environment": "production", "target": {"region": "eu"}, "count": 3},
    annotations={"destructiveHint": True, "readOnlyHint": False},
)


def rule(**overrides):
    base = {
        "enabled": True,
        "server_id": None,
        "server": None,
        "tool_pattern": "*",
        "mode": "",
        "destructive": None,
        "read_only": None,
        "open_world": None,
        "conditions": [],
    }
    base.update(overrides)
    return SimpleNamespace(**base)


@pytest.mark.parametrize(
    ("overrides", "matched", "why"),
    [
        ({}, True, "matches *"),
        ({"enabled": False}, False, "disabled"),
        ({"server_id": 1, "server": SimpleNamespace(slug="payments")}, False, "not payments"),
        ({"server_id": 1, "server": SimpleNamespace(slug="deploy")}, True, ""),
        ({"tool_pattern": "create_*"}, True, "matches create_*"),
        ({"tool_pattern": "delete_*"}, False, "does not match delete_*"),
        ({"mode": "url"}, False, "mode is form"),
        ({"destructive": True}, True, "server says destructiveHint=true"),
        ({"destructive": False}, False, "server says destructiveHint=true"),
        ({"open_world": True}, True, "does not say openWorldHint: taken as true"),
        (
            {"conditions": [{"argument": "environment", "op": "==", "value": "production"}]},
            True,
            "production",
        ),
        ({"conditions": [{"argument": "environment", "op": "==", "value": "staging"}]}, False, "not =="),
        (
            {"conditions": [{"argument": "environment", "op": "in", "value": ["staging", "qa"]}]},
            False,
            "not in",
        ),
        ({"conditions": [{"argument": "target.region", "op": "==", "value": "eu"}]}, True, "target.region"),
        ({"conditions": [{"argument": "missing", "op": "!=", "value": 1}]}, False, "missing is not given"),
        ({"conditions": [{"argument": "count", "op": "exists"}]}, True, "count is given"),
        ({"conditions": [{"argument": "count", "op": "not in", "value": [1, 2]}]}, True, ""),
        ({"conditions": [{"argument": "count", "op": ">"}]}, False, "malformed condition"),
    ],
)
def test_rule_matching(overrides: dict, matched: bool, why: str) -> None:
    verdict = rules.evaluate(rule(**overrides), DEPLOY)
    assert verdict.matched is matched
    assert why in verdict.why


@pytest.mark.parametrize(
    ("condition", "arguments", "matched"),
    [
        ({"argument": "flag", "op": "==", "value": 1}, {"flag": True}, False),
        ({"argument": "force", "op": "==", "value": False}, {"force": 0}, False),
        ({"argument": "force", "op": "!=", "value": False}, {"force": 0}, True),
        ({"argument": "force", "op": "==", "value": False}, {"force": False}, True),
        ({"argument": "n", "op": "in", "value": [False, 2]}, {"n": 0}, False),
        ({"argument": "n", "op": "not in", "value": [True]}, {"n": 1}, True),
        ({"argument": "n", "op": "==", "value": 1}, {"n": 1.0}, True),
        ({"argument": "o", "op": "==", "value": {"a": [True]}}, {"o": {"a": [1]}}, False),
        ({"argument": "o", "op": "==", "value": {"a": [1]}}, {"o": {"a": [1.0]}}, True),
    ],
)
def test_booleans_are_not_numbers_in_conditions(condition: dict, arguments: dict, matched: bool) -> None:
    """JSON equality, as a rule's author writes it: ``true`` is not ``1``, at any depth; ``1`` is ``1.0``."""
    subject = rules.Subject("s", "t", "form", arguments)
    assert rules.evaluate(rule(conditions=[condition]), subject).matched is matched


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ({"op": "=="}, "argument name"),
        ({"argument": "a", "op": "~"}, "unknown op"),
        ({"argument": "a", "op": "in", "value": "x"}, "list value"),
        ("nope", "object"),
    ],
)
def test_malformed_conditions_are_named(condition, problem: str) -> None:
    assert problem in rules.check_condition(condition)
