"""Presence with one reviewer's request open in two tabs: closing one leaves them looking through the
other."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from approvals.models import Membership
from approvals.services import presence
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> Any:
    cache.clear()
    bob, carol = factories.user("bob"), factories.user("carol")
    release = factories.team("release", (bob, Membership.Role.REVIEWER), (carol, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    ir = factories.open_round(factories.call(deploy), team_=release).input_requests.get()
    return SimpleNamespace(bob=bob, carol=carol, ir=ir)


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_closing_one_of_two_tabs_keeps_the_reviewer_looking(world) -> None:
    bob = signed_in(world.bob)
    url = f"/requests/{world.ir.pk}/presence/"
    assert bob.post(url, {"tab": "first"}).status_code == 200
    assert bob.post(url, {"tab": "second"}).status_code == 200
    assert presence.viewers([world.ir.pk]) == {str(world.ir.pk): ["bob"]}  # once, not once per tab
    bob.post(url, {"leave": "1", "tab": "first"})
    assert presence.viewers([world.ir.pk]) == {str(world.ir.pk): ["bob"]}
    # Carol's page says who else looks: Bob still does.
    assert "bob" in signed_in(world.carol).post(url, {"tab": "c1"}).content.decode()
    bob.post(url, {"leave": "1", "tab": "second"})
    assert presence.viewers([world.ir.pk]) == {str(world.ir.pk): ["carol"]}


def test_a_leave_naming_no_tab_ends_every_page_of_the_reviewer(world) -> None:
    bob = signed_in(world.bob)
    url = f"/requests/{world.ir.pk}/presence/"
    bob.post(url, {"tab": "first"})
    bob.post(url)  # a page that names no tab
    bob.post(url, {"leave": "1"})
    assert presence.viewers([world.ir.pk]) == {}


def test_a_tab_name_out_of_shape_names_no_tab() -> None:
    assert presence.tab_of("a1-_Z") == "a1-_Z"
    for odd in ("", "x" * 33, "a\x00b", "a b", "é", None, ["a"]):
        assert presence.tab_of(odd) == ""
