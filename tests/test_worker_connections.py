"""A Celery worker child keeps its pooled PostgreSQL connection from one task to the next.

Celery's Django fixup closed the whole connection pool of a prefork child around every task, so each task
opened new PostgreSQL connections. The hub's Celery app turns that off and hands the connection back to the
pool instead (elicit_hub/celery.py). These run the fixup's real signal handlers on the real database.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery.fixups.django import DjangoWorkerFixup
from celery.signals import task_postrun, task_prerun
from django.db import connection, connections

from approvals import tasks
from elicit_hub.celery import app

pytestmark = pytest.mark.django_db(transaction=True)


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return int(pid)


def run_task_signals(fixup: DjangoWorkerFixup) -> None:
    """What a prefork child does around one task: the fixup's handlers and the app's own, in order."""
    task = tasks.expire_stale
    fixup.on_task_prerun(sender=task)
    task_prerun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    fixup.on_task_postrun(sender=task)
    task_postrun.send(sender=task, task_id="t", task=task, args=(), kwargs={}, retval=None, state="SUCCESS")


def prefork_fixup() -> DjangoWorkerFixup:
    fixup = DjangoWorkerFixup(app)
    fixup.worker = SimpleNamespace(pool_cls="celery.concurrency.prefork:TaskPool")  # type: ignore[assignment]
    return fixup


def test_tasks_reuse_the_pooled_connection() -> None:
    fixup = prefork_fixup()
    backend_pid()
    pool = connection.pool
    opened = pool.get_stats()["connections_num"]
    for _ in range(3):
        run_task_signals(fixup)
        # Handed back between tasks, not held: the wrapper has no connection until the next query.
        assert connection.connection is None
        backend_pid()
    assert connection.pool is pool and not pool.closed
    assert pool.get_stats()["connections_num"] == opened  # no new PostgreSQL connection


def test_an_unusable_connection_is_replaced_after_a_task() -> None:
    fixup = prefork_fixup()
    first = backend_pid()
    # Another session ends this one, as a PostgreSQL restart would.
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    finally:
        other.close()
    with pytest.raises(Exception):  # noqa: B017 - psycopg's OperationalError, wrapped by Django
        backend_pid()
    run_task_signals(fixup)
    assert backend_pid() != first
