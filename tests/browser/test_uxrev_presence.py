"""Presence in the browser: one reviewer with the same request open in two tabs closes one of them."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import Membership
from approvals.services import presence
from tests import factories
from tests.browser.conftest import wait_live
from tests.live import wait_until

pytestmark = pytest.mark.timeout(120)


def entries(ir: Any) -> dict[str, float]:
    return presence._decoded(presence._client().hgetall(presence._key(ir.pk)))


def test_closing_one_of_two_tabs_leaves_the_reviewer_looking(web: Any, new_page: Any) -> None:
    bob = factories.user("bob")
    release = factories.team("release", (bob, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    ir = factories.open_round(factories.call(deploy), team_=release).input_requests.get()

    first = new_page("bob")
    first.goto(f"/requests/{ir.pk}/")
    wait_live(first)
    wait_until(lambda: len(entries(ir)) == 1, 15, what="the first tab's presence")
    second = first.context.new_page()
    second.goto(f"/requests/{ir.pk}/")
    wait_live(second)
    # Each tab holds its own entry: the beat names its page.
    wait_until(lambda: len(entries(ir)) == 2, 15, what="the second tab's own presence")

    second.close(run_before_unload=True)  # its "I left" goes out as it closes
    wait_until(lambda: len(entries(ir)) == 1, 15, what="the closed tab's leave")
    assert presence.viewers([ir.pk]) == {str(ir.pk): ["bob"]}
    first.close(run_before_unload=True)
    wait_until(lambda: not entries(ir), 15, what="the last tab's leave")
    assert presence.viewers([ir.pk]) == {}
