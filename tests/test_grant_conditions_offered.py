"""The approve form's grant conditions: each one offered can hold for the call it was offered for."""

from __future__ import annotations

import json

from approvals import rules
from approvals.templatetags.approvals_ui import grant_conditions


def test_every_condition_offered_holds_for_the_arguments_it_came_from() -> None:
    arguments = {"env": "prod", "a.b": 1, "a": {"b": 2}, "force": False}
    offered = grant_conditions(arguments)
    assert [item["name"] for item in offered] == ["env", "a", "force"]
    for item in offered:
        assert rules.holds(json.loads(item["json"]), arguments).matched, item


def test_nothing_is_offered_for_arguments_that_are_not_an_object() -> None:
    assert grant_conditions(["env", "prod"]) == []
