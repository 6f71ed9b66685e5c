"""Rules on a tool's annotations read the server's claims so that they only ever ask for more care: a hint
the server does not say (or says as anything but a JSON boolean) takes MCP's careful default, so leaving an
annotation out, or writing ``"false"``, never lets a call past a rule on destructive tools."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from approvals import rules


def rule(**overrides: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
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
    return SimpleNamespace(**(base | overrides))


def subject(annotations: Any) -> rules.Subject:
    return rules.Subject("deploy", "wipe", "form", {}, annotations)


@pytest.mark.parametrize(
    "annotations",
    [
        {},  # a server that says nothing about its tool
        {"title": "Wipe"},
        {"destructiveHint": "true"},  # not a boolean: says nothing
        {"destructiveHint": None},
        {"readOnlyHint": "yes"},
        {"readOnlyHint": 1},
        {"readOnlyHint": True, "destructiveHint": True},  # a contradiction: the careful reading
        None,
        ["readOnlyHint"],
    ],
)
def test_a_rule_on_destructive_tools_catches_a_tool_whose_server_does_not_say_otherwise(annotations) -> None:
    verdict = rules.evaluate(rule(destructive=True), subject(annotations))
    assert verdict.matched is True, verdict.why
    assert rules.evaluate(rule(destructive=False), subject(annotations)).matched is False


@pytest.mark.parametrize(
    "annotations",
    [{}, {"readOnlyHint": "false"}, {"readOnlyHint": "no"}, {"readOnlyHint": True, "destructiveHint": True}],
)
def test_a_rule_on_read_only_tools_needs_the_server_to_say_read_only_as_a_boolean(annotations) -> None:
    """A rule for read-only tools usually asks for less care: a string, or a claim the server contradicts
    itself, does not make a tool read-only."""
    assert rules.evaluate(rule(read_only=True), subject(annotations)).matched is False
    assert rules.evaluate(rule(read_only=False), subject(annotations)).matched is True


def test_what_the_server_says_as_booleans_still_decides() -> None:
    read_only = subject({"readOnlyHint": True})
    assert rules.evaluate(rule(read_only=True), read_only).matched is True
    assert (
        rules.evaluate(rule(destructive=True), read_only).matched is False
    )  # MCP: read-only, not destructive
    assert rules.evaluate(rule(destructive=True), subject({"destructiveHint": False})).matched is False
    closed = subject({"openWorldHint": False})
    assert rules.evaluate(rule(open_world=False), closed).matched is True
    assert "server says openWorldHint=false" in rules.evaluate(rule(open_world=False), closed).why


def test_a_hint_not_said_takes_the_careful_default_and_the_explanation_says_so() -> None:
    verdict = rules.evaluate(rule(open_world=True, destructive=True), subject({}))
    assert verdict.matched is True
    assert "does not say destructiveHint: taken as true" in verdict.why
    assert "does not say openWorldHint: taken as true" in verdict.why
    assert rules.evaluate(rule(open_world=False), subject({})).matched is False


@pytest.mark.parametrize("tool", ["gol_daer\u202e", "read\u200b_log", "read_log\n; rule 'all' matched"])
def test_an_explanation_shows_the_agents_tool_name_with_its_hidden_characters_as_codes(tool: str) -> None:
    """The routing page prints each rule's "why" as text: a direction override in a tool name (an agent
    names the tool) would make the line read otherwise than the hub wrote it."""
    missed = rules.evaluate(rule(tool_pattern="deploy_*"), rules.Subject("s", tool, "form", {}))
    matched = rules.evaluate(rule(), rules.Subject("s", tool, "form", {}))
    for verdict in (missed, matched):
        assert all(char.isprintable() for char in verdict.why), verdict.why
        assert "\u27e8U+" in verdict.why
    assert rules.shown("create_deployment") == "create_deployment"
