"""The hub's database backend (`elicit_hub.postgres`), on the real PostgreSQL: the pool's check of a
connection as it leaves the pool costs no round trip for a connection nothing happened to, a connection whose
session the server ended is replaced before anyone gets it, and each session names the process holding it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from elicit_hub.postgres import base as dbcheck
from tests.live import wait_until

pytestmark = pytest.mark.usefixtures("live_db")


class Counting(psycopg.Connection):
    """A connection that notes every statement it is asked to run."""

    statements: list[str]

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.setdefault("statements", []).append(str(query))
        return super().execute(query, *args, **kwargs)


@pytest.fixture
def pool() -> Iterator[ConnectionPool]:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with ConnectionPool(
        kwargs={**params, "autocommit": True},
        connection_class=Counting,
        check=dbcheck.check_connection,
        min_size=1,
        max_size=1,
        open=True,
    ) as pool:
        yield pool


def _backend(pool: ConnectionPool) -> tuple[int, list[str]]:
    with pool.connection() as conn:
        pid = conn.info.backend_pid
        before = list(conn.__dict__.get("statements", []))
        conn.execute("SELECT 1")
        return pid, before


def test_a_connection_nothing_happened_to_is_lent_without_a_round_trip(pool: ConnectionPool) -> None:
    first, _ = _backend(pool)
    second, ran_before = _backend(pool)
    third, ran_before_third = _backend(pool)
    assert first == second == third  # the one connection, lent three times
    # Only the work itself: psycopg's own check sent an empty query before each lending.
    assert ran_before == ["SELECT 1"]
    assert ran_before_third == ["SELECT 1", "SELECT 1"]


def test_a_connection_whose_session_the_server_ended_is_replaced(pool: ConnectionPool) -> None:
    ended, _ = _backend(pool)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [ended])
    with pool._lock:  # the idle connection, looked at in place (a check-out would check it)
        idle = pool._pool[0]
    wait_until(lambda: dbcheck.has_input(idle), 10, 0.05, what="the server's goodbye on the socket")

    with pool.connection() as conn:
        assert conn.execute("SELECT pg_backend_pid()").fetchone() == (conn.info.backend_pid,)
        assert conn.info.backend_pid != ended
    assert idle.closed
    assert idle.__dict__["statements"][-1] == ""  # psycopg's check ran on it, and failed


def test_the_hubs_pool_lends_with_this_check() -> None:
    assert connection.pool is not None
    assert connection.pool._check is dbcheck.check_connection


def test_the_hubs_sessions_name_the_process_that_opened_them() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        assert cursor.fetchone() == (f"elicit-hub pid {os.getpid()}",)
