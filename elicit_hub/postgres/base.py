"""Django's PostgreSQL backend, whose pool checks a connection as it leaves the pool with no round trip when
it needs none (``ENGINE: "elicit_hub.postgres"``).

psycopg's own check (``ConnectionPool.check_connection``, which Django's ``CONN_HEALTH_CHECKS`` installs)
sends an empty query every time a connection is lent: a round trip to PostgreSQL for every request, task and
long-poll read, before any work: about seventeen round trips per call in the load benchmark at 2 calls/s.

A connection idle in the pool has nothing to read: PostgreSQL sends nothing unprompted to a session that
listens to nothing. When the server ends the session (a restart, ``pg_terminate_backend``, an idle timeout)
it sends the reason and closes the socket, and the socket becomes readable. So :func:`check_connection`
looks at the socket, without blocking: nothing to read, and the connection is lent as it is; anything to
read (an ended session, or a message it did not expect), and it runs psycopg's check, which raises for a
dead connection, so the pool discards it and lends another. The first request after a PostgreSQL restart
still gets a working connection.

A peer that vanished without closing (a host powered off, a cable pulled) leaves nothing to read either way;
psycopg's empty query would wait on it as long as the request's own first statement does.
"""

from __future__ import annotations

import os
import select
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


def has_input(conn: psycopg.Connection) -> bool:
    """Whether the connection's socket has something to read (or was closed), without waiting."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def check_connection(conn: psycopg.Connection) -> None:
    """Raises if ``conn`` is not fit to lend (the pool then discards it and tries another)."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    if has_input(conn):
        ConnectionPool.check_connection(conn)


APPLICATION_NAME = "elicit-hub pid {pid}"


class DatabaseWrapper(base.DatabaseWrapper):
    """Django's, with :func:`check_connection` as its pool's check (Django's pool takes no check of one's own:
    it passes psycopg's, or none, itself). Its sessions name the process that opened them in
    ``pg_stat_activity.application_name`` (``elicit-hub pid 1234``), unless DATABASE_URL names one itself
    (``?application_name=...``)."""

    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        params.setdefault("application_name", APPLICATION_NAME.format(pid=os.getpid()))
        return params

    @property
    def pool(self) -> Any:
        pool = super().pool  # type: ignore[misc]  # django-stubs leave the pool out
        if pool is not None and pool._check is not check_connection:
            pool._check = check_connection
        return pool
