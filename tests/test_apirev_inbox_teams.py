"""A long-polled inbox answers as soon as its version differs (docs/api.md, reviewer endpoints), and the
version differs when the reviewer's teams change: a team joined during the wait brings its requests then, not
when the wait runs out. A reviewer deactivated during the wait is refused then too (401), not after it."""

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

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("live_db")]

WAIT = 60  # the most a long-poll waits: an answer well before it came because something changed


def _reviewer() -> tuple[Any, str]:
    alice = factories.user(f"alice-{uuid.uuid4().hex[:6]}")
    factories.team(f"quiet-{uuid.uuid4().hex[:6]}", (alice, Membership.Role.REVIEWER))
    _, token = tokens.personal_token_create(user=alice, name="bot")
    return alice, token


def _pending_request(team: Any) -> InputRequest:
    server = factories.server(f"deploy-{uuid.uuid4().hex[:6]}", default_team=team)
    rnd = factories.open_round(factories.call(server), team_=team)
    ir = rnd.input_requests.select_related("round__call", "team", "escalation_team").get()
    broadcast.queue_changed("round.opened", ir.round.call_id, [ir])
    return ir


def _poll_while(web: Daphne, token: str, change: Any) -> tuple[float, httpx.Response, str]:
    async def scenario() -> tuple[float, httpx.Response, str]:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=web.url, headers=headers, timeout=WAIT + 30) as client:
            version = (await client.get("/api/v1/inbox")).headers["Inbox-Version"]
            started = time.monotonic()
            poll = asyncio.ensure_future(
                client.get("/api/v1/inbox", params={"version": version, "wait": WAIT})
            )
            await asyncio.sleep(1.0)
            assert not poll.done()  # nothing changed yet: it waits
            await sync_to_async(change)()
            response = await poll
            return time.monotonic() - started, response, version

    return async_to_sync(scenario)()


def test_a_team_joined_during_the_wait_answers_with_its_requests(web: Daphne) -> None:
    alice, token = _reviewer()
    ops = factories.team(f"ops-{uuid.uuid4().hex[:6]}")
    ir = _pending_request(ops)

    elapsed, response, version = _poll_while(
        web, token, lambda: Membership.objects.create(team=ops, user=alice, role=Membership.Role.REVIEWER)
    )
    assert response.status_code == 200, response.content
    assert [item["id"] for item in response.json()] == [str(ir.pk)]
    assert response.headers["Inbox-Version"] != version
    assert elapsed < WAIT / 2  # answered on the change, not when the wait ran out


def test_a_reviewer_deactivated_during_the_wait_is_refused_then(web: Daphne) -> None:
    alice, token = _reviewer()

    elapsed, response, _ = _poll_while(web, token, lambda: _saved(alice))
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "unauthorized"
    assert elapsed < WAIT / 2


def _saved(user: Any) -> None:
    """Deactivated as the admin does it: a save (its signal tells open sockets and waits)."""
    user.is_active = False
    user.save()


def test_someone_elses_team_change_does_not_end_the_wait(web: Daphne) -> None:
    """The scopes' counter is the whole hub's: another reviewer's new team is not a change of this inbox."""
    _, token = _reviewer()
    bob = factories.user(f"bob-{uuid.uuid4().hex[:6]}")
    ops = factories.team(f"ops-{uuid.uuid4().hex[:6]}")

    async def scenario() -> tuple[float, httpx.Response, str]:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=web.url, headers=headers, timeout=30) as client:
            version = (await client.get("/api/v1/inbox")).headers["Inbox-Version"]
            started = time.monotonic()
            poll = asyncio.ensure_future(client.get("/api/v1/inbox", params={"version": version, "wait": 8}))
            await asyncio.sleep(0.5)
            await sync_to_async(Membership.objects.create)(team=ops, user=bob, role=Membership.Role.REVIEWER)
            response = await poll
            return time.monotonic() - started, response, version

    elapsed, response, version = async_to_sync(scenario)()
    assert response.status_code == 200
    assert response.json() == [] and response.headers["Inbox-Version"] == version
    assert elapsed >= 7  # it waited out its 8 s
