"""Presence under reviewers opening the same request at the same instant: each of them is kept."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection

from approvals.models import Membership
from approvals.services import presence
from tests import factories

REVIEWERS = 8


def at_once(actions: list[Any]) -> None:
    """Run each action in its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(actions))

    def run(action: Any) -> None:
        try:
            barrier.wait()
            action()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


@pytest.fixture
def world(live_db: None) -> Any:
    users = [factories.user(f"reviewer{i}") for i in range(REVIEWERS)]
    release = factories.team("release", *[(u, Membership.Role.REVIEWER) for u in users])
    deploy = factories.server("deploy", default_team=release)
    ir = factories.open_round(factories.call(deploy), team_=release).input_requests.get()
    return users, ir


@pytest.mark.parametrize("attempt", range(3))
def test_reviewers_opening_a_request_at_once_are_all_looking(world, attempt: int) -> None:
    """Each touch read the whole set, added its viewer and wrote the set back: of reviewers opening the
    request together only the last writer was kept, and the others' pages and the team's queue missed
    them until their next beat (and lost them again at the next collision)."""
    users, ir = world
    at_once([lambda u=u: presence.presence_touch(input_request=ir, user=u, tab="t") for u in users])
    assert presence.viewers([ir.pk]) == {str(ir.pk): sorted(u.username for u in users)}


def test_two_tabs_opening_at_once_each_keep_their_entry(world) -> None:
    """One reviewer opens the request in two tabs at once, then closes one: still looking through the
    other (the tab whose entry was lost used to leave them looking at nothing)."""
    users, ir = world
    bob = users[0]
    for _ in range(3):
        at_once(
            [lambda tab=tab: presence.presence_touch(input_request=ir, user=bob, tab=tab) for tab in "ab"]
        )
        presence.presence_leave(input_request=ir, user=bob, tab="a")
        assert presence.viewers([ir.pk]) == {str(ir.pk): [bob.username]}
        presence.presence_leave(input_request=ir, user=bob, tab="b")
        assert presence.viewers([ir.pk]) == {}


def test_a_leave_at_the_same_instant_as_touches_removes_only_its_own_viewer(world) -> None:
    users, ir = world
    leaver, stayers = users[0], users[1:]
    presence.presence_touch(input_request=ir, user=leaver, tab="x")
    at_once(
        [lambda: presence.presence_leave(input_request=ir, user=leaver, tab="x")]
        + [lambda u=u: presence.presence_touch(input_request=ir, user=u, tab="t") for u in stayers]
    )
    assert presence.viewers([ir.pk]) == {str(ir.pk): sorted(u.username for u in stayers)}


def test_a_viewer_arriving_while_the_sweep_clears_the_request_is_kept(world, monkeypatch) -> None:
    """Beat's sweep read the request's entries, found them all lapsed and deleted the set: a reviewer who
    opened the request between that read and the delete was wiped out, and the team told nobody looked."""
    users, ir = world
    bob, carol = users[0], users[1]
    now = [1_000_000.0]
    monkeypatch.setattr(presence, "time", SimpleNamespace(time=lambda: now[0]))
    presence.presence_touch(input_request=ir, user=bob)
    now[0] += presence.PRESENCE_TTL + 1  # Bob's page went without a word: his entry lapsed
    live, arrived = presence._live, list[bool]()

    def carol_arrives_as_the_sweep_looks(entries: dict, at: float) -> dict:
        if not arrived:
            arrived.append(True)  # once, from the sweep's own look (her touch looks too)
            presence.presence_touch(input_request=ir, user=carol)
        return live(entries, at)

    monkeypatch.setattr(presence, "_live", carol_arrives_as_the_sweep_looks)
    assert presence.presence_sweep() == 0  # somebody looks: nothing to tell
    assert arrived
    assert presence.viewers([ir.pk]) == {str(ir.pk): [carol.username]}


def test_a_reviewer_naming_a_new_tab_at_every_touch_keeps_a_bounded_set(world, monkeypatch) -> None:
    """Every touch read and rewrote all of a request's entries, and each tab name made one more for 30 s: a
    page (or a script) drawing a new name at every beat grew the set without bound."""
    users, ir = world
    bob, carol = users[0], users[1]
    now = [1_000_000.0]
    monkeypatch.setattr(presence, "time", SimpleNamespace(time=lambda: now[0]))
    presence.presence_touch(input_request=ir, user=carol, tab="carol")
    for n in range(presence.MAX_TABS * 3):
        now[0] += 0.01
        presence.presence_touch(input_request=ir, user=bob, tab=f"t{n}")
    stored = presence._decoded(presence._client().hgetall(presence._key(ir.pk)))
    bobs = [entry for entry in stored if entry.startswith(bob.username + presence.TAB_SEP)]
    assert len(bobs) == presence.MAX_TABS
    assert f"{bob.username}{presence.TAB_SEP}t{presence.MAX_TABS * 3 - 1}" in bobs  # the latest is kept
    assert f"{carol.username}{presence.TAB_SEP}carol" in stored  # another reviewer's entry is not touched
    assert presence.viewers([ir.pk]) == {str(ir.pk): sorted([bob.username, carol.username])}
