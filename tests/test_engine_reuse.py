"""The web process reuses its engine connections: Redis connections across requests, and PostgreSQL
statements prepared once per pooled connection."""

from __future__ import annotations

import uuid

import httpx
import pytest
from django.conf import settings
from django.core.cache import cache, caches
from django.db import connection

from approvals.models import Membership, Team
from approvals.services import tokens
from tests import factories
from tests.live import Daphne

pytestmark = pytest.mark.timeout(120)


def _redis_connections_received() -> int:
    return int(cache._cache.get_client().info("stats")["total_connections_received"])  # type: ignore[attr-defined]


@pytest.mark.usefixtures("live_db")
def test_api_requests_do_not_open_a_redis_connection_each(web: Daphne) -> None:
    """Django makes a cache object per request context under ASGI; each used to open its own Redis
    connection (the throttle reads and writes the cache on every API request)."""
    alice = factories.user(f"alice-{uuid.uuid4().hex[:6]}")
    factories.team(f"release-{uuid.uuid4().hex[:6]}", (alice, Membership.Role.REVIEWER))
    _, token = tokens.personal_token_create(user=alice, name="bot")
    with httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        assert client.get("/api/v1/inbox").status_code == 200  # the process's first connections
        before = _redis_connections_received()
        statuses = {client.get("/api/v1/inbox").status_code for _ in range(40)}
        opened = _redis_connections_received() - before
    assert statuses == {200}
    assert opened < 10, f"{opened} new Redis connections for 40 requests"


def test_cache_objects_share_one_client() -> None:
    first, second = caches.create_connection("default"), caches.create_connection("default")
    assert first is not second
    assert first._cache is second._cache  # type: ignore[attr-defined]
    assert first._cache.get_client(write=True) is second._cache.get_client(write=True)  # type: ignore[attr-defined]
    first.set("shared-client-probe", 7)
    assert second.get("shared-client-probe") == 7


@pytest.mark.django_db
def test_a_statement_run_again_and_again_is_prepared() -> None:
    assert settings.ELICIT_DB_PREPARE_THRESHOLD > 0
    slug = f"prepared-{uuid.uuid4().hex[:6]}"
    for _ in range(settings.ELICIT_DB_PREPARE_THRESHOLD + 1):
        assert list(Team.objects.filter(slug=slug)) == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [row[0] for row in cursor.fetchall()]
    assert any('"approvals_team"' in statement and "$1" in statement for statement in statements)


@pytest.mark.usefixtures("live_db")
def test_the_middleware_chain_runs_in_one_thread_hop_under_asgi(monkeypatch: pytest.MonkeyPatch) -> None:
    """A middleware in async mode hops to a thread and back for each of its process_request and
    process_response; the chain is ordered so that every one runs in sync mode, in the view's one hop."""
    import asyncio

    from django.utils.deprecation import MiddlewareMixin

    from elicit_hub.asgi import application

    async_mode: list[str] = []
    acall = MiddlewareMixin.__acall__

    async def spy(self: MiddlewareMixin, request: object) -> object:
        async_mode.append(type(self).__name__)
        return await acall(self, request)

    monkeypatch.setattr(MiddlewareMixin, "__acall__", spy)
    alice = factories.user(f"alice-{uuid.uuid4().hex[:6]}")
    factories.team(f"release-{uuid.uuid4().hex[:6]}", (alice, Membership.Role.REVIEWER))
    _, token = tokens.personal_token_create(user=alice, name="bot")

    async def requests() -> set[int]:
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=headers) as c:
            answers = [await c.get("/api/v1/inbox"), await c.get("/accounts/login/")]
        return {response.status_code for response in answers}

    assert asyncio.run(requests()) == {200}
    assert async_mode == []
