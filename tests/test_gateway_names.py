"""Tool names on `/mcp`: `<slug>__<tool>`, at most 64 characters, long ones with a stable hash suffix."""

from __future__ import annotations

import hashlib

from approvals.gateway.names import MAX_NAME, gateway_name


def test_a_short_name_is_slug_and_tool() -> None:
    assert gateway_name("demo", "create_deployment") == "demo__create_deployment"


def test_a_name_of_exactly_64_characters_is_kept() -> None:
    tool = "t" * (MAX_NAME - len("demo__"))
    assert gateway_name("demo", tool) == f"demo__{tool}"


def test_a_long_name_is_cut_to_64_with_a_stable_hash_of_the_whole_name() -> None:
    tool = "a_really_long_tool_name_" * 4
    name = gateway_name("deploy-bot", tool)
    assert len(name) == MAX_NAME
    full = f"deploy-bot__{tool}"
    assert name == full[:55] + "_" + hashlib.sha256(full.encode()).hexdigest()[:8]
    assert gateway_name("deploy-bot", tool) == name


def test_long_names_that_share_their_start_stay_distinct() -> None:
    base = "x" * 80
    assert gateway_name("demo", base + "1") != gateway_name("demo", base + "2")
