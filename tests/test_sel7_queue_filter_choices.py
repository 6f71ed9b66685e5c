"""The queue's filters list the servers and tools of what waits, which agents name as they please: an agent
that asks with thousands of tool names does not put thousands of options into every reviewer's page. The
lists keep those with the most requests waiting, in name order, and say they were cut."""

from __future__ import annotations

import re
from typing import Any

import pytest

from approvals import selectors
from tests import factories

pytestmark = pytest.mark.django_db


def _options(page: str, name: str) -> list[str]:
    select = page[page.index(f'<select name="{name}">') :]
    select = select[: select.index("</select>")]
    return re.findall(r'<option value="([^"]*)"', select)[1:]  # "All" aside


def test_the_tool_filter_offers_the_most_waiting_tools_and_says_the_list_is_cut(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selectors, "FILTER_CHOICES_MAX", 3, raising=False)
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    server = factories.server("deploy", default_team=release)
    for n in range(8):
        factories.open_round(factories.call(server, tool=f"noise_{n}"), team_=release)
    for tool, rounds in (("Zeta", 3), ("alpha", 2), ("beta", 2)):
        for _ in range(rounds):
            factories.open_round(factories.call(server, tool=tool), team_=release)
    client.force_login(alice)

    page = client.get("/").text
    assert _options(page, "tool") == ["alpha", "beta", "Zeta"]
    assert "data-filters-cut" in page
    # A link still filters by a tool the list left out, and the form says so.
    chosen = client.get("/", {"tool": "noise_5"}).text
    assert _options(chosen, "tool") == ["alpha", "beta", "Zeta", "noise_5"]
    assert chosen.count("data-round=") == 1


def test_a_short_list_is_whole_and_says_nothing(client: Any) -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    server = factories.server("deploy", default_team=release)
    for tool in ("b_tool", "a_tool", "B_tool"):
        factories.open_round(factories.call(server, tool=tool), team_=release)
    client.force_login(alice)
    page = client.get("/").text
    assert _options(page, "tool") == ["a_tool", "B_tool", "b_tool"]
    assert _options(page, "server") == ["deploy"]
    assert "data-filters-cut" not in page
