"""Which engine a fault says is down: PostgreSQL or Redis unreachable, or answering but refusing writes (a
read-only standby after a failover; a Redis out of memory, read-only or unable to save). Pure
classification, for every layer: ``approvals.outage`` answers such faults with a 503, the services decide
what a refused write means for them (a token's use is best effort)."""

from __future__ import annotations

import kombu.exceptions
import psycopg.errors
import redis.exceptions
from django.db import InterfaceError, InternalError, OperationalError


class EngineUnavailable(Exception):
    """An engine the request needs does not answer."""

    def __init__(self, engine: str) -> None:
        super().__init__(f"{engine} is unavailable")
        self.engine = engine


# Redis unreachable, or answering but refusing to serve: out of memory under `maxmemory` (OOM), a replica
# since a failover (READONLY), a replica cut off from its primary (MASTERDOWN), a cluster that lost a shard
# (CLUSTERDOWN). Each refuses every write for as long as it lasts, as an outage does; while still loading
# its data (LOADING) Redis answers with a ConnectionError already.
REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
)
# The same kind of refusal, which redis-py raises as a plain ResponseError, told apart by its code: a Redis
# that failed to save its snapshot (MISCONF: every write, and PING, refused until a save succeeds), or one
# short of the replicas `min-replicas-to-write` asks for (NOREPLICAS).
REDIS_REFUSALS = frozenset({"MISCONF", "NOREPLICAS"})
# Connection failures, a pool that found no free connection in time (psycopg_pool.PoolTimeout arrives
# as OperationalError), a connection lost mid-request (InterfaceError).
DATABASE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)
ENGINE_ERRORS: tuple[type[Exception], ...] = (
    EngineUnavailable,
    *DATABASE_ERRORS,
    *REDIS_ERRORS,
    kombu.exceptions.OperationalError,
)


def engine_of(exc: object) -> str | None:
    """The engine an exception says is down ("postgresql", "redis"), or None for any other exception."""
    if isinstance(exc, EngineUnavailable):
        return exc.engine
    if isinstance(exc, InternalError) and isinstance(exc.__cause__, psycopg.errors.ReadOnlySqlTransaction):
        # A server that takes no writes (a standby the address leads to after a failover, or one set
        # default_transaction_read_only): every write fails until it is a primary again, as in an outage.
        return "postgresql"
    if isinstance(exc, DATABASE_ERRORS):
        # A limit of PostgreSQL's own (SQLSTATE class 54: a value too large for a search vector or an index
        # row) is an OperationalError too, but no outage: the same request fails the same way every time, so
        # a 503 telling the caller to retry would be a promise the hub cannot keep.
        if isinstance(exc.__cause__, psycopg.errors.ProgramLimitExceeded):
            return None
        return "postgresql"
    if isinstance(exc, (*REDIS_ERRORS, kombu.exceptions.OperationalError)):
        return "redis"
    if isinstance(exc, redis.exceptions.ResponseError) and exc.status_code in REDIS_REFUSALS:
        return "redis"
    return None
