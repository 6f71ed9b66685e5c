"""The audit page in a browser: the search box an auditor starts from is at the top, with the filters in a
grid beside each other, and new events wait behind a pill while the auditor reads further down."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.audit import core as audit
from approvals.audit.core import Actor
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_search_comes_first_and_the_filters_sit_in_a_grid(new_page: Any, web: Any) -> None:
    factories.user("root", is_superuser=True, is_staff=True)
    for n in range(60):
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"message": f"event {n}"})
    page = new_page("root")
    page.goto("/audit/")

    search = page.get_by_label("Search", exact=True).bounding_box()
    since = page.get_by_label("From").bounding_box()
    actor = page.get_by_label("Actor", exact=True).bounding_box()
    assert search and since and actor
    assert search["y"] + search["height"] < 900  # in the first screen, without scrolling
    assert search["y"] < since["y"]  # the search box first, then the filters
    assert abs(since["y"] - actor["y"]) < 5 and actor["x"] > since["x"]  # beside each other, not a column

    page.mouse.wheel(0, 1500)
    page.wait_for_function("() => window.scrollY >= 40")  # scrolled (the wheel does not wait for it)
    for n in range(3):
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"message": f"new {n}"})
    # The page polls every 5 seconds: a poll between two of the records shows a smaller count first.
    pill = page.locator("[data-audit-pill]")
    expect(pill).to_have_text("3 new events", timeout=20_000)
    expect(pill).to_be_visible()
