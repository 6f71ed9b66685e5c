"""An extension asked for from the deadline a reviewer saw: a double click, a second tab or two reviewers
at once extend the round once, not once each."""

from __future__ import annotations

import html
import re
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Membership, Policy, Round
from approvals.services import extensions
from approvals.services.errors import Conflict
from tests import factories


@pytest.fixture
def world(live_db: None) -> Any:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    policy = Policy.objects.create(name="extendable", ttl=3600, extend_by=900, max_extensions=3)
    rnd = factories.open_round(
        factories.call(factories.server("deploy", default_team=release)), team_=release
    )
    InputRequest.objects.filter(round=rnd).update(policy=policy)
    Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() + timedelta(minutes=3))
    ir = InputRequest.objects.select_related("round", "policy").get(round=rnd)
    return alice, bob, ir


def at_once(*actions: Any) -> list[Any]:
    barrier = threading.Barrier(len(actions))
    results: list[Any] = [None] * len(actions)

    def run(index: int, action: Any) -> None:
        try:
            barrier.wait()
            results[index] = action()
        except Conflict as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_the_offer_names_the_deadline_it_extends(world) -> None:
    alice, _, ir = world
    offer = extensions.offer(ir, alice)
    assert offer is not None
    assert offer.since == ir.round.deadline
    assert offer.deadline == ir.round.deadline + timedelta(seconds=900)


@pytest.mark.parametrize("attempt", range(3))
def test_two_reviewers_extending_what_they_both_saw_extend_it_once(world, attempt: int) -> None:
    """Both pages offered "Add 15 minutes" to the same deadline; both clicked. The round was extended twice
    (30 minutes, two of its three extensions), though each asked for 15 minutes from what they saw."""
    alice, bob, ir = world
    seen = extensions.offer(ir, alice).since  # type: ignore[union-attr]
    results = at_once(
        lambda: extensions.round_extend(input_request_id=ir.pk, user=alice, seen=seen),
        lambda: extensions.round_extend(input_request_id=ir.pk, user=bob, seen=seen),
    )
    extended = [r for r in results if isinstance(r, Round)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert len(extended) == 1 and len(refused) == 1
    assert refused[0].code == "already_extended"
    assert "already extended" in refused[0].message
    rnd = Round.objects.get(pk=ir.round_id)
    assert (rnd.extensions, rnd.deadline) == (1, seen + timedelta(seconds=900))
    assert AuditEvent.objects.filter(verb="round.extended").count() == 1


def test_a_double_click_extends_once_and_a_fresh_look_extends_again(world) -> None:
    alice, _, ir = world
    seen = extensions.offer(ir, alice).since  # type: ignore[union-attr]
    extensions.round_extend(input_request_id=ir.pk, user=alice, seen=seen)
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice, seen=seen)
    assert refused.value.code == "already_extended"
    ir = InputRequest.objects.select_related("round", "policy").get(pk=ir.pk)
    again = extensions.offer(ir, alice)
    assert again is not None and again.since == seen + timedelta(seconds=900)
    rnd = extensions.round_extend(input_request_id=ir.pk, user=alice, seen=again.since)
    assert (rnd.extensions, rnd.deadline) == (2, seen + timedelta(seconds=1800))


def test_without_a_seen_deadline_each_extension_adds(world) -> None:
    """The API's extend takes no body: each call extends, as documented."""
    alice, bob, ir = world
    start = ir.round.deadline
    extensions.round_extend(input_request_id=ir.pk, user=alice)
    rnd = extensions.round_extend(input_request_id=ir.pk, user=bob)
    assert (rnd.extensions, rnd.deadline) == (2, start + timedelta(seconds=1800))


def test_the_pages_offer_posted_twice_extends_once(world) -> None:
    alice, _, ir = world
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/requests/{ir.pk}/").content.decode()
    (seen,) = re.findall(r'name="seen" value="([^"]+)"', page)

    first = browser.post(f"/requests/{ir.pk}/extend/", {"seen": html.unescape(seen)})
    second = browser.post(f"/requests/{ir.pk}/extend/", {"seen": html.unescape(seen)})

    assert first.status_code == 302
    assert second.status_code == 409
    assert "already extended meanwhile" in second.content.decode()
    assert Round.objects.get(pk=ir.round_id).extensions == 1


@pytest.mark.parametrize("seen", ["", "tomorrow", "2026-12-07T10:00:00"])
def test_an_offer_whose_deadline_cannot_be_read_extends_nothing(world, seen: str) -> None:
    """A form naming a deadline the hub cannot read (none given, not a date, no zone) is refused: extending
    without the guard it asked for could add a second extension."""
    alice, _, ir = world
    browser = Client()
    browser.force_login(alice)
    refused = browser.post(f"/requests/{ir.pk}/extend/", {"seen": seen})
    assert refused.status_code == 400
    assert "could not be read" in refused.content.decode()
    assert Round.objects.get(pk=ir.round_id).extensions == 0
