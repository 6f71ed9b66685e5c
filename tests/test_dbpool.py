"""The pool's health check is skipped for a connection that passed it moments ago (elicit_hub.dbpool), on a
real psycopg pool over the test database: counted, given up after its window, and a connection that died
meanwhile is caught by the next check and replaced."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from psycopg_pool import ConnectionPool

from elicit_hub import dbpool

pytestmark = pytest.mark.django_db(transaction=True)


def backend_pid(conn: Any) -> int:
    return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every real check run (psycopg_pool's own), by the backend it checked."""
    seen: list[int] = []
    real = ConnectionPool.check_connection

    def counted(conn: Any) -> None:
        real(conn)
        seen.append(conn.info.backend_pid)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return seen


@pytest.fixture
def pool() -> Iterator[ConnectionPool]:
    """One connection, checked by a `RecentlyChecked` (its window is set by each test)."""
    params = {**connection.get_connection_params(), "autocommit": True}
    pool = ConnectionPool(kwargs=params, min_size=1, max_size=1, check=dbpool.RecentlyChecked(0), open=False)
    pool.open(wait=True)
    try:
        yield pool
    finally:
        pool.close()


def test_a_connection_that_passed_the_check_moments_ago_is_handed_out_unchecked(
    pool: ConnectionPool, checks: list[int]
) -> None:
    pool._check.window = 60  # type: ignore[attr-defined]
    with pool.connection() as conn:
        first = backend_pid(conn)
    assert checks == [first]  # never checked before: checked
    for _ in range(3):
        with pool.connection() as conn:
            assert backend_pid(conn) == first
    assert checks == [first]  # passed a check within the window: not again


def test_past_its_window_a_connection_is_checked_again(pool: ConnectionPool, checks: list[int]) -> None:
    pool._check.window = 0.05  # type: ignore[attr-defined]
    with pool.connection() as conn:
        first = backend_pid(conn)
    time.sleep(0.2)
    with pool.connection() as conn:
        assert backend_pid(conn) == first
    assert checks == [first, first]


def test_a_connection_that_died_in_the_pool_is_caught_by_the_next_check_and_replaced(
    pool: ConnectionPool, checks: list[int]
) -> None:
    pool._check.window = 0.05  # type: ignore[attr-defined]
    with pool.connection() as conn:
        first = backend_pid(conn)
    # Another session ends it as it sits in the pool, as a PostgreSQL restart would.
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    finally:
        other.close()
    time.sleep(0.2)
    with pool.connection() as conn:
        replaced = backend_pid(conn)
    assert replaced != first
    assert checks[-1] == replaced  # the new connection passed its own check


def test_with_no_window_every_connection_is_checked_every_time(
    pool: ConnectionPool, checks: list[int]
) -> None:
    for _ in range(3):
        with pool.connection() as conn:
            backend_pid(conn)
    assert len(checks) == 3


def test_the_hub_s_pool_checks_through_recently_checked(settings: Any) -> None:
    connection.close()
    connection.ensure_connection()
    check = connection.pool._check
    assert isinstance(check, dbpool.RecentlyChecked)
    assert check.window == settings.ELICIT_DB_RECHECK_AFTER_MS / 1000
