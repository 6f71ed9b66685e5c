"""The long-polled inbox: ``Inbox-Version`` on every answer, and ``version=...&wait=N`` waits for a change.

Against a real Daphne on the suite's PostgreSQL and Redis; the changes are announced as the services
announce them (``broadcast.queue_changed`` after the commit).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async

from approvals import broadcast
from approvals.models import InputRequest, Membership
from approvals.services import tokens
from tests import factories
from tests.live import Daphne

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("live_db")]


def _reviewer(team_slug: str) -> tuple[Any, Any, str]:
    alice = factories.user(f"alice-{uuid.uuid4().hex[:6]}")
    team = factories.team(team_slug, (alice, Membership.Role.REVIEWER))
    _, token = tokens.personal_token_create(user=alice, name="bot")
    return alice, team, token


def _open_request(team: Any) -> InputRequest:
    server = factories.server(f"deploy-{uuid.uuid4().hex[:6]}", default_team=team)
    rnd = factories.open_round(factories.call(server), team_=team)
    ir = rnd.input_requests.select_related("round__call", "team", "escalation_team").get()
    broadcast.queue_changed("round.opened", ir.round.call_id, [ir])
    return ir


def _client(web: Daphne, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=web.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_every_answer_carries_a_version_that_changes_with_the_queue(web: Daphne) -> None:
    _, team, token = _reviewer(f"release-{uuid.uuid4().hex[:6]}")

    async def scenario() -> tuple[str, str, str, list[Any]]:
        async with _client(web, token) as client:
            first = await client.get("/api/v1/inbox")
            again = await client.get("/api/v1/inbox")
            ir = await sync_to_async(_open_request)(team)
            after = await client.get("/api/v1/inbox")
            assert after.status_code == 200
            return (
                first.headers["Inbox-Version"],
                again.headers["Inbox-Version"],
                after.headers["Inbox-Version"],
                [item["id"] == str(ir.pk) for item in after.json()],
            )

    first, again, after, items = async_to_sync(scenario)()
    assert first == again
    assert after != first
    assert items == [True]


def test_a_long_poll_is_answered_when_a_request_reaches_the_team(web: Daphne) -> None:
    _, team, token = _reviewer(f"release-{uuid.uuid4().hex[:6]}")

    async def scenario() -> tuple[float, httpx.Response, str, InputRequest]:
        async with _client(web, token) as client:
            version = (await client.get("/api/v1/inbox")).headers["Inbox-Version"]
            started = time.monotonic()
            poll = asyncio.ensure_future(client.get("/api/v1/inbox", params={"version": version, "wait": 30}))
            await asyncio.sleep(1.0)
            assert not poll.done()  # nothing changed yet: it waits
            ir = await sync_to_async(_open_request)(team)
            response = await poll
            return time.monotonic() - started, response, version, ir

    elapsed, response, version, ir = async_to_sync(scenario)()
    assert response.status_code == 200
    assert [item["id"] for item in response.json()] == [str(ir.pk)]
    assert response.headers["Inbox-Version"] != version
    assert elapsed < 20  # woken by the notice, not by the 30 s limit


def test_another_teams_queue_does_not_end_the_wait(web: Daphne) -> None:
    _, _, token = _reviewer(f"release-{uuid.uuid4().hex[:6]}")
    other = factories.team(f"billing-{uuid.uuid4().hex[:6]}")

    async def scenario() -> tuple[float, httpx.Response, str]:
        async with _client(web, token) as client:
            version = (await client.get("/api/v1/inbox")).headers["Inbox-Version"]
            started = time.monotonic()
            poll = asyncio.ensure_future(client.get("/api/v1/inbox", params={"version": version, "wait": 3}))
            await asyncio.sleep(0.5)
            await sync_to_async(_open_request)(other)
            response = await poll
            return time.monotonic() - started, response, version

    elapsed, response, version = async_to_sync(scenario)()
    assert response.status_code == 200
    assert response.json() == []
    assert response.headers["Inbox-Version"] == version
    assert elapsed >= 2.5  # it waited out its 3 s


def test_a_version_that_is_already_stale_is_answered_at_once(web: Daphne) -> None:
    _, team, token = _reviewer(f"release-{uuid.uuid4().hex[:6]}")
    ir = _open_request(team)

    async def scenario() -> tuple[float, httpx.Response]:
        async with _client(web, token) as client:
            started = time.monotonic()
            response = await client.get("/api/v1/inbox", params={"version": "stale", "wait": 30})
            return time.monotonic() - started, response

    elapsed, response = async_to_sync(scenario)()
    assert [item["id"] for item in response.json()] == [str(ir.pk)]
    assert elapsed < 15


def test_leaving_the_team_changes_the_version_and_empties_the_inbox(web: Daphne) -> None:
    alice, team, token = _reviewer(f"release-{uuid.uuid4().hex[:6]}")
    _open_request(team)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with _client(web, token) as client:
            before = await client.get("/api/v1/inbox")
            await sync_to_async(Membership.objects.filter(user=alice).delete)()
            after = await client.get(
                "/api/v1/inbox", params={"version": before.headers["Inbox-Version"], "wait": 30}
            )
            return before, after

    before, after = async_to_sync(scenario)()
    assert len(before.json()) == 1
    assert after.json() == []
    assert after.headers["Inbox-Version"] != before.headers["Inbox-Version"]


def test_a_reviewer_removed_during_the_wait_is_answered_without_the_teams_requests(web: Daphne) -> None:
    """The teams a long-poll starts with come with the reviewer's token (one statement); after the wait they
    are read again, so a membership removed meanwhile takes effect at once."""
    alice, team, token = _reviewer(f"release-{uuid.uuid4().hex[:6]}")
    _open_request(team)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with _client(web, token) as client:
            before = await client.get("/api/v1/inbox")
            poll = asyncio.ensure_future(
                client.get("/api/v1/inbox", params={"version": before.headers["Inbox-Version"], "wait": 30})
            )
            await asyncio.sleep(1.0)
            assert not poll.done()  # waiting, with her team's queue in its version
            await sync_to_async(Membership.objects.filter(user=alice).delete)()
            await sync_to_async(_open_request)(team)  # her former team's queue changes: the wait ends
            return before, await poll

    before, after = async_to_sync(scenario)()
    assert len(before.json()) == 1
    assert after.status_code == 200 and after.json() == []


def test_wait_and_version_are_checked(web: Daphne) -> None:
    _, _, token = _reviewer(f"release-{uuid.uuid4().hex[:6]}")
    with httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        negative = client.get("/api/v1/inbox", params={"wait": -1})
        long_version = client.get("/api/v1/inbox", params={"version": "v" * 65, "wait": 1})
    for response, field in ((negative, "wait"), (long_version, "version")):
        assert response.status_code == 400
        body = response.json()["error"]
        assert body["code"] and body["message"]
        assert field in str(body.get("fields", body["message"]))
