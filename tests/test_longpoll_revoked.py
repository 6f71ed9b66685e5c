"""A long-poll waits up to a minute; a credential revoked meanwhile is not answered when the wait ends. The
agent's token, the reviewer's token, the agent or the user deactivated, the browser session signed out: the
answer is a 401 (with ``WWW-Authenticate``), not the call or the inbox.

Against a real Daphne on the suite's PostgreSQL and Redis; the waits are woken as the services wake them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from approvals import broadcast
from approvals.models import AgentClient, Membership, PersonalToken, ToolCall
from approvals.services import tokens
from tests import factories
from tests.live import Daphne

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("live_db")]


def _open_request(team: Any) -> None:
    server = factories.server(f"deploy-{uuid.uuid4().hex[:6]}", default_team=team)
    rnd = factories.open_round(factories.call(server), team_=team)
    ir = rnd.input_requests.select_related("round__call", "team", "escalation_team").get()
    broadcast.queue_changed("round.opened", ir.round.call_id, [ir])


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="elicit-hub"'
    assert response.json()["error"]["code"] == "unauthorized"


async def _long_poll_while(
    client: httpx.AsyncClient, url: str, params: dict[str, Any], meanwhile: Callable[[], None]
) -> httpx.Response:
    """GET `url` waiting, and run `meanwhile` (sync: the revocation, then what wakes the wait) once it
    waits."""
    waiting = asyncio.create_task(client.get(url, params=params))
    await asyncio.sleep(1.0)  # the request is past its authentication and waits
    assert not waiting.done()
    await sync_to_async(meanwhile)()
    return await asyncio.wait_for(waiting, timeout=30)


@pytest.mark.parametrize("revoke", ["deactivated", "token rotated"])
def test_an_agent_revoked_while_its_long_poll_waits_gets_401_not_the_call(web: Daphne, revoke: str) -> None:
    server = factories.server(f"deploy-{uuid.uuid4().hex[:6]}")
    agent, token = factories.agent(f"bot-{uuid.uuid4().hex[:6]}", servers=[server])
    call = factories.call(server, agent, status=ToolCall.Status.AWAITING_INPUT)

    def meanwhile() -> None:
        if revoke == "deactivated":
            AgentClient.objects.filter(pk=agent.pk).update(is_active=False)
        else:
            AgentClient.objects.filter(pk=agent.pk).update(token_hash=tokens.hash_token("eha_another"))
        factories.finish_call(call.pk)

    async def scenario() -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=web.url, headers=headers, timeout=60) as client:
            return await _long_poll_while(client, f"/api/v1/calls/{call.pk}", {"wait": 30}, meanwhile)

    response = async_to_sync(scenario)()
    _refused(response)
    assert "result" not in response.text


def test_an_agent_still_valid_after_the_wait_gets_its_call(web: Daphne) -> None:
    server = factories.server(f"deploy-{uuid.uuid4().hex[:6]}")
    agent, token = factories.agent(f"bot-{uuid.uuid4().hex[:6]}", servers=[server])
    call = factories.call(server, agent, status=ToolCall.Status.AWAITING_INPUT)

    async def scenario() -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=web.url, headers=headers, timeout=60) as client:
            return await _long_poll_while(
                client, f"/api/v1/calls/{call.pk}", {"wait": 30}, lambda: factories.finish_call(call.pk)
            )

    response = async_to_sync(scenario)()
    assert response.status_code == 200 and response.json()["status"] == "completed"


@pytest.mark.parametrize("revoke", ["token deleted", "user deactivated", "left the team"])
def test_a_reviewer_revoked_while_the_inbox_long_poll_waits_gets_401_or_nothing(
    web: Daphne, revoke: str
) -> None:
    alice = factories.user(f"alice-{uuid.uuid4().hex[:6]}")
    team = factories.team(f"release-{uuid.uuid4().hex[:6]}", (alice, Membership.Role.REVIEWER))
    _, token = tokens.personal_token_create(user=alice, name="bot")

    def meanwhile() -> None:
        if revoke == "token deleted":
            PersonalToken.objects.filter(user=alice).delete()
        elif revoke == "user deactivated":
            type(alice).objects.filter(pk=alice.pk).update(is_active=False)
        else:
            Membership.objects.filter(user=alice).delete()
        _open_request(team)

    async def scenario() -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=web.url, headers=headers, timeout=60) as client:
            first = await client.get("/api/v1/inbox")
            params = {"version": first.headers["Inbox-Version"], "wait": 30}
            return await _long_poll_while(client, "/api/v1/inbox", params, meanwhile)

    response = async_to_sync(scenario)()
    if revoke == "left the team":  # still signed in: the inbox, without the team's requests
        assert response.status_code == 200 and response.json() == []
    else:
        _refused(response)


def test_a_session_signed_out_while_the_inbox_long_poll_waits_gets_401(web: Daphne) -> None:
    alice = factories.user(f"alice-{uuid.uuid4().hex[:6]}")
    team = factories.team(f"release-{uuid.uuid4().hex[:6]}", (alice, Membership.Role.REVIEWER))
    session = SessionStore()
    session[SESSION_KEY] = str(alice.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = alice.get_session_auth_hash()
    session.create()

    def meanwhile() -> None:
        SessionStore(session.session_key).delete()  # what signing out elsewhere does
        _open_request(team)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        cookies = {"sessionid": session.session_key}
        async with httpx.AsyncClient(base_url=web.url, cookies=cookies, timeout=60) as client:
            first = await client.get("/api/v1/inbox")
            params = {"version": first.headers["Inbox-Version"], "wait": 30}
            return first, await _long_poll_while(client, "/api/v1/inbox", params, meanwhile)

    first, response = async_to_sync(scenario)()
    assert first.status_code == 200
    _refused(response)
