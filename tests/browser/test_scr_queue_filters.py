"""The queue's filters from the keyboard: moving through a filter's choices never reloads the page under the
reviewer; a choice made with the pointer applies at once."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import Membership
from tests import factories

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def waiting(live_db: None) -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server("deploy", name="Deploy bot", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[server])
    factories.open_round(factories.call(server, agent), team_=release)


def test_arrow_keys_move_through_a_filters_choices_without_reloading_the_queue(
    web: Any, new_page: Any, waiting: None
) -> None:
    page = new_page("alice")
    risk = page.get_by_label("Risk")
    risk.focus()
    page.evaluate("window.__stayed = true")  # gone if the page reloads
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    expect(risk).to_have_value("high")
    expect(risk).to_be_focused()
    assert page.evaluate("window.__stayed === true")
    assert "risk=" not in page.url
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/?*risk=high*")
    expect(page.get_by_label("Risk")).to_have_value("high")


def test_a_filter_chosen_with_the_pointer_applies_at_once(web: Any, new_page: Any, waiting: None) -> None:
    page = new_page("alice")
    mode = page.get_by_label("Mode")
    mode.dispatch_event("pointerdown")  # the pointer opens the list; the choice is made in it
    mode.select_option("url")
    page.wait_for_url("**/?*mode=url*")
    expect(page.locator("[data-empty-filtered]")).to_be_visible()
