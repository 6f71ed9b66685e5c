"""The queue puts the rounds whose deadlines come soonest first, on the page, in its fragment and when it
shows only some of them (ELICIT_QUEUE_MAX)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals import selectors
from approvals.models import Membership, Round
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting() -> Any:
    """alice reviews for release; three rounds wait on her, opened in this order, due in 3 h, 10 min, 1 h."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server("deploy", name="Deploy bot", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[server])
    now = timezone.now()
    rounds = []
    for minutes in (180, 10, 60):
        rnd = factories.open_round(factories.call(server, agent), team_=release)
        Round.objects.filter(pk=rnd.pk).update(deadline=now + timedelta(minutes=minutes))
        rounds.append(rnd)
    return alice, rounds


def _shown(html: str) -> list[int]:
    return [int(found) for found in re.findall(r'<article class="card[^"]*" id="round-(\d+)"', html)]


def test_the_queue_shows_the_soonest_deadline_first(client, waiting) -> None:
    alice, (late, soon, middle) = waiting
    client.force_login(alice)
    assert _shown(client.get("/").content.decode()) == [soon.pk, middle.pk, late.pk]
    assert _shown(client.get("/queue/list/").content.decode()) == [soon.pk, middle.pk, late.pk]


def test_a_capped_queue_shows_the_rounds_due_soonest_not_the_oldest(client, waiting, settings) -> None:
    settings.ELICIT_QUEUE_MAX = 2
    alice, (_late, soon, middle) = waiting
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert _shown(html) == [soon.pk, middle.pk]
    assert 'data-pending-total="3" data-capped="2"' in html
    assert "Rounds with later deadlines wait behind the 2 shown here" in html


def test_each_card_carries_its_place_so_cards_arriving_live_sort_as_the_list_does(waiting) -> None:
    """The page places a card that arrives live by ``data-order``: as text it sorts as the server sorts."""
    alice, _rounds = waiting
    queue = selectors.queue_cards(alice, limit=10)
    orders = [card.order for card in queue.cards]
    assert orders == sorted(orders) and len(set(orders)) == 3
    # A later deadline sorts later however many digits its times have; same deadline: the round opened first.
    first, second = queue.cards[0], queue.cards[1]
    assert first.order < second.order
    first.deadline = second.deadline
    opened_first = (first.opened_at, first.round_id) < (second.opened_at, second.round_id)
    assert (first.order < second.order) == opened_first


def test_a_round_whose_server_stops_waiting_sooner_goes_by_that_time(client, waiting) -> None:
    """A push round's server waits only until its own deadline: after that the request is gone, so the queue
    places it by that time, and its card says so."""
    alice, (late, soon, middle) = waiting
    Round.objects.filter(pk=late.pk).update(server_deadline=timezone.now() + timedelta(minutes=5))
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert _shown(html) == [late.pk, soon.pk, middle.pk]
    card = html[html.index(f'id="round-{late.pk}"') :]
    assert "the server stops waiting" in card[: card.index("</article>")]
    assert html.count("data-server-deadline") == 1
