"""The test suite's own processes and connections (`tests.live`): a run cut short leaves no process behind,
and a test's own event loop leaves no connection checked out."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from tests.live import ROOT, release_thread_connections, wait_until

PARENT = """
import sys, time
from tests.live import Process
child = Process("left-behind-check", [sys.executable, "-c", "import time; time.sleep(120)"], {}).start()
print(child.proc.pid, flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie nobody reaped yet does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def test_a_process_a_test_started_ends_when_the_test_run_is_killed() -> None:
    """A worker left by a killed run would take the next run's tasks from the same queue (and keep its test
    database open): the suite's processes end with the process that started them."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _running(child)
        parent.kill()  # SIGKILL: no clean-up code of the run's own gets to run
        parent.wait(10)
        wait_until(lambda: not _running(child), timeout=10, what="the left-behind process to end")
    finally:
        parent.kill()
        if child and _running(child):
            os.kill(child, signal.SIGKILL)


def _asgiref_thread_backend() -> int | None:
    """The backend of the connection asgiref's shared thread holds, if any (asked on that thread)."""

    def backend() -> int | None:
        return connection.connection.info.backend_pid if connection.connection else None

    return asyncio.run(sync_to_async(backend)())


def _open_backends() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        return {pid for (pid,) in cursor.fetchall()}


@pytest.mark.usefixtures("live_db")
def test_a_connection_a_tests_own_event_loop_used_goes_back() -> None:
    async def query() -> int:
        return await sync_to_async(lambda: connection.cursor().connection.info.backend_pid)()

    used = asyncio.run(query())
    assert _asgiref_thread_backend() == used  # still held by the thread, after its loop has ended
    release_thread_connections()
    assert _asgiref_thread_backend() is None
    connection.close_pool()  # what the test database's drop does: the pool's idle connections close
    assert used not in _open_backends()


def _backend_on(executor: ThreadPoolExecutor) -> int | None:
    def backend() -> int | None:
        return connection.connection.info.backend_pid if connection.connection else None

    return executor.submit(backend).result(timeout=10)


@pytest.mark.usefixtures("live_db")
def test_a_connection_a_request_thread_kept_goes_back() -> None:
    """A request the in-process handler served whose loop ended before it did never sent
    ``request_finished``: its pooled thread, which lives for the whole run, keeps the connection."""
    from elicit_hub.asgi import django_asgi_app

    pool = django_asgi_app.threads
    executor = pool.acquire()
    try:
        # A request's work, with no request_finished after it.
        used = executor.submit(lambda: connection.cursor().connection.info.backend_pid).result(timeout=10)
    finally:
        pool.release(executor)
    assert executor in pool.idle_executors()
    assert _backend_on(executor) == used  # still held by the idle thread
    release_thread_connections()
    assert _backend_on(executor) is None
    connection.close_pool()
    assert used not in _open_backends()


@pytest.mark.usefixtures("live_db")
def test_a_connection_a_thread_ended_with_stays_open_until_a_full_collection() -> None:
    """Why the test database's teardown collects before it names the sessions left open: a thread that ends
    without closing its connection leaves it to objects nothing reaches any more (Django's connection
    wrapper refers to itself), so the session ends only when a full collection frees them; until then the
    pool counts it as lent. In a long test run full collections are rare."""
    used: list[int] = []

    def query() -> None:
        used.append(connection.cursor().connection.info.backend_pid)

    gc.collect()
    gc.disable()
    try:
        thread = threading.Thread(target=query)
        thread.start()
        thread.join(10)
        assert used and used[0] in _open_backends()  # the thread has ended; its session has not
        gc.collect()
        wait_until(lambda: used[0] not in _open_backends(), 5, what="the session to end")
    finally:
        gc.enable()
