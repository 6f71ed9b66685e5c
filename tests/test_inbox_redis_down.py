"""The long-polled inbox while Redis is down. The queues' counters behind ``Inbox-Version`` live in Redis;
while it is unreachable the inbox still answers from PostgreSQL, with a version of the page itself, so a bot's
long-poll still waits for a change (the page read again every few seconds) instead of being answered at once,
which made a bot that asks again at once read the inbox in a tight loop for as long as the outage lasted."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.test import Client

from approvals.models import Membership
from approvals.services import tokens
from tests import factories
from tests.live import redis_unreachable


def reviewer() -> tuple[Any, Client]:
    alice = factories.user("alice")
    team = factories.team("release", (alice, Membership.Role.REVIEWER))
    _, token = tokens.personal_token_create(user=alice, name="bot")
    return team, Client(headers={"authorization": f"Bearer {token}"})


def opened(team: Any) -> str:
    server = factories.server("deploy", default_team=team)
    return str(factories.open_round(factories.call(server), team_=team).input_requests.get().pk)


@pytest.mark.django_db(transaction=True)
def test_with_redis_down_a_long_poll_on_an_unchanged_inbox_waits(redis_down: None) -> None:
    team, bot = reviewer()
    first = opened(team)
    answer = bot.get("/api/v1/inbox")
    assert answer.status_code == 200
    version = answer["Inbox-Version"]
    assert [item["id"] for item in answer.json()] == [first]

    started = time.monotonic()
    again = bot.get("/api/v1/inbox", {"version": version, "wait": 2})
    waited = time.monotonic() - started

    assert again.status_code == 200
    assert again["Inbox-Version"] == version
    assert [item["id"] for item in again.json()] == [first]
    assert waited >= 1.9  # it waited out its time: nothing changed


@pytest.mark.django_db(transaction=True)
def test_with_redis_down_a_long_poll_ends_with_the_change_it_waited_for(redis_down: None) -> None:
    team, bot = reviewer()
    version = bot.get("/api/v1/inbox")["Inbox-Version"]
    polled: list[Any] = []
    poll = threading.Thread(
        target=lambda: polled.append(bot.get("/api/v1/inbox", {"version": version, "wait": 30}))
    )
    poll.start()
    time.sleep(0.5)
    new = opened(team)
    poll.join(timeout=40)

    (answer,) = polled
    assert answer.status_code == 200
    assert [item["id"] for item in answer.json()] == [new]
    assert answer["Inbox-Version"] != version


@pytest.mark.django_db(transaction=True)
def test_a_version_read_from_the_page_is_answered_at_once_once_redis_is_back() -> None:
    team, bot = reviewer()
    first = opened(team)
    with redis_unreachable():
        version = bot.get("/api/v1/inbox")["Inbox-Version"]

    started = time.monotonic()
    answer = bot.get("/api/v1/inbox", {"version": version, "wait": 30})

    assert time.monotonic() - started < 25  # not the whole wait: the version is Redis's again
    assert [item["id"] for item in answer.json()] == [first]
    assert answer["Inbox-Version"] != version
