"""The database pool's health check, skipped for a connection that passed one moments ago.

Django's pool (psycopg_pool) checks every connection as it leaves the pool: an empty statement, a round trip
to PostgreSQL for each request and each task, before any of their own. A connection that answered that check
half a second ago answers it again; HikariCP, the JVM's common pool, skips its check the same way within
``aliveBypassWindowMs`` (500 ms by default). Under the load benchmark the check was one round trip in ten.

`RecentlyChecked` replaces the pool's check with the same check, skipped while the connection's last passing
check is younger than ``ELICIT_DB_RECHECK_AFTER_MS``. What it gives up: a connection that PostgreSQL dropped
within that window (a restart or failover completing in under half a second) reaches its request unchecked;
that request meets the error as a 503 with Retry-After (``approvals.outage``), and the pool replaces the
connection when it comes back broken. 0 checks every connection every time, as Django does.

Django builds the pool with its own check and takes none in the pool's options, so the check is put in place
when a process's pool hands out its first connection (`install`, on ``connection_created``).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from django.conf import settings
from django.db.backends.signals import connection_created
from psycopg import Connection
from psycopg.pq import ConnStatus
from psycopg_pool import ConnectionPool


class RecentlyChecked:
    """A pool's check: ``ConnectionPool.check_connection``, unless the connection passed it less than
    ``window`` seconds ago and still looks healthy from this side."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._passed: weakref.WeakKeyDictionary[Connection[Any], float] = weakref.WeakKeyDictionary()

    def __call__(self, conn: Connection[Any]) -> None:
        now = time.monotonic()
        passed = self._passed.get(conn)
        if passed is not None and now - passed < self.window and conn.pgconn.status == ConnStatus.OK:
            return
        ConnectionPool.check_connection(conn)  # raises when the connection is broken
        self._passed[conn] = now


def _installed(sender: Any, connection: Any, **kwargs: Any) -> None:
    pool = getattr(connection, "pool", None)
    # Django passes ConnectionPool.check_connection when CONN_HEALTH_CHECKS is on, None when it is off.
    if pool is not None and pool._check is ConnectionPool.check_connection:
        pool._check = RecentlyChecked(settings.ELICIT_DB_RECHECK_AFTER_MS / 1000)


def install() -> None:
    """Put `RecentlyChecked` in place of each process's pool check (unless ELICIT_DB_RECHECK_AFTER_MS = 0)."""
    if settings.ELICIT_DB_RECHECK_AFTER_MS > 0:
        connection_created.connect(_installed, dispatch_uid="elicit_hub.dbpool")
