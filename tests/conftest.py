"""Test set-up on the real engines: the embedded ones unless DATABASE_URL / REDIS_URL point elsewhere.

Tests that need other processes (a Celery worker, Daphne, the demo MCP server) to see their rows use the
``live_db`` fixture (a transactional test database); plain ``db`` tests run inside a rolled-back
transaction.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests import shards
from tests.live import CeleryWorker, Daphne, child_env, redis_unreachable, release_thread_connections


def _flush_retrying_deadlocks() -> None:
    """pytest-django empties the test database with one TRUNCATE over every table after each live test.
    A worker still finishing the previous test's task can hold a lock on one of them: PostgreSQL then
    reports a deadlock and the flush loses. Retrying it is the usual answer to a deadlock."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def handle_with_retry(self: flush.Command, **options: object) -> None:
        for attempt in range(6):
            try:
                return handle(self, **options)
            except CommandError as exc:
                if attempt == 5 or "deadlock" not in str(exc.__cause__):
                    raise
                time.sleep(0.2 * (attempt + 1))

    flush.Command.handle = handle_with_retry  # type: ignore[method-assign]


def _allow_loopback() -> None:
    """The demo server and the test listeners run on loopback, which the outbound guard refuses unless
    listed; the tests allow it whatever DEBUG is, here and in the processes they start."""
    from django.conf import settings

    if "ELICIT_OUTBOUND_ALLOW" not in os.environ:
        os.environ["ELICIT_OUTBOUND_ALLOW"] = "127.0.0.0/8,::1"
        settings.ELICIT_OUTBOUND_ALLOW = os.environ["ELICIT_OUTBOUND_ALLOW"]


# The append-only tables refuse TRUNCATE from every session (migration 0007). Emptying the test database
# is the one place that needs it: the flush turns their TRUNCATE triggers off and on again inside its own
# transaction (a table owner's right), so no other session ever sees them off.
_APPEND_ONLY_TRIGGERS = (
    ("approvals_auditevent", "approvals_audit_no_truncate"),
    ("approvals_audithead", "approvals_audithead_no_truncate"),
)


def _flush_past_the_append_only_triggers() -> None:
    from django.core.management.commands import flush

    sql_flush = flush.sql_flush

    def sql_flush_with_triggers_off(*args: object, **kwargs: object) -> list[str]:
        statements = sql_flush(*args, **kwargs)
        if not statements:
            return statements
        triggers = [(table, trigger) for table, trigger in _APPEND_ONLY_TRIGGERS if table in statements[0]]
        return [
            *(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}" for table, trigger in triggers),
            *statements,
            *(f"ALTER TABLE {table} ENABLE TRIGGER {trigger}" for table, trigger in triggers),
        ]

    flush.sql_flush = sql_flush_with_triggers_off  # type: ignore[assignment]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run only the K-th of N parts of the suite, split by file (tests/shards.py); CI runs 1/2, 2/2",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        flags = shards.kept((item.path for item in items), spec)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    keep = [item for item, flag in zip(items, flags, strict=True) if flag]
    left = [item for item, flag in zip(items, flags, strict=True) if not flag]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep


def pytest_configure(config: pytest.Config) -> None:
    _flush_retrying_deadlocks()
    _allow_loopback()
    _flush_past_the_append_only_triggers()
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        from elicit_hub import engines

        engines.start()


@pytest.fixture(autouse=True)
def _thread_connections_released() -> Iterator[None]:
    """After each test, the connections of the threads that outlive it go back: asgiref's shared thread's,
    and the in-process ASGI handler's request threads' (``tests.live.release_thread_connections``)."""
    yield
    release_thread_connections()


@pytest.fixture(scope="session", autouse=True)
def _no_session_left_on_the_test_database(
    request: pytest.FixtureRequest, django_db_setup: None, django_db_blocker: Any
) -> Iterator[None]:
    """Torn down after every process the tests started has stopped, just before pytest-django drops the test
    database. A session still open on it then makes the drop fail ("being accessed by other users"), which
    pytest-django reports without saying whose session it was. This waits up to 10 s for closing sessions to
    end, then names what is left (when it connected, what it ran last) in a warning, and ends it, so the
    database is dropped all the same."""
    yield
    from django.db import connection

    name = connection.settings_dict["NAME"]
    left: list[tuple[Any, ...]] = []
    garbage: list[tuple[Any, ...]] = []
    with django_db_blocker.unblock():
        connection.close()
        connection.close_pool()  # this process's own idle connections, as the drop itself closes them
        with connection._nodb_cursor() as cursor:
            left = _sessions_on(cursor, name, wait=10)
            if left:
                # A connection only unreachable objects still refer to (a thread's or a context's, gone) ends
                # when a full collection frees it; one that something alive holds does not.
                gc.collect()
                still = _sessions_on(cursor, name, wait=5)
                garbage = [row for row in left if row[0] not in {pid for pid, *_ in still}]
                left = still
            for pid, *_ in left:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    if garbage:
        message = (
            "sessions left open on the test database by unreachable objects, ended by a full collection:"
            f" {garbage!r}"
        )
        request.node.warn(pytest.PytestWarning(message))
    if left:
        message = f"sessions left open on the test database, now ended: {left!r}"
        for backend, application, *_ in left:
            message += f"; {application!r}: {_holder(application)}; held through: {_owners(backend)}"
        request.node.warn(pytest.PytestWarning(message))


def _sessions_on(cursor: Any, name: str, *, wait: float) -> list[tuple[Any, ...]]:
    """The other sessions on database `name`, once none is left or `wait` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        cursor.execute(
            "SELECT pid, application_name, backend_start, state, state_change, left(query, 300)"
            " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        left = cursor.fetchall()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _holder(application_name: str) -> str:
    """The process a session's ``application_name`` names (``elicit-hub pid N``): this test process, with its
    threads and what each is doing, or another, with its command line and parent."""
    from elicit_hub.postgres.base import APPLICATION_NAME

    pid_text = application_name.removeprefix(APPLICATION_NAME.format(pid=""))
    if pid_text == application_name or not pid_text.isdigit():
        return "not a process of the hub"
    pid = int(pid_text)
    if pid == os.getpid():
        return f"this test process, whose threads are: {_threads()}"
    try:
        process = psutil.Process(pid)
        return f"process {pid} (parent {process.ppid()}): {' '.join(process.cmdline())[:300]}"
    except psutil.Error:
        return f"process {pid}, gone"


def _owners(backend: int) -> str:
    """What in this process still refers to the connection whose session is `backend`: from each such psycopg
    connection, the chain of the objects that refer to it, up to six steps (a thread, a task, a context)."""
    import psycopg
    from django.db.backends.base.base import BaseDatabaseWrapper

    def session_of(conn: psycopg.Connection[Any]) -> int | None:
        try:
            return None if conn.closed else conn.info.backend_pid
        except Exception:
            return None

    held: list[Any] = []
    wrappers: list[BaseDatabaseWrapper] = []
    for obj in gc.get_objects():
        if isinstance(obj, BaseDatabaseWrapper) and obj.connection is not None:
            wrappers.append(obj)
        elif isinstance(obj, psycopg.Connection) and session_of(obj) == backend:
            held.append(obj)
    if not held:
        return "no connection object of this process (another process, or one closed since)"
    threads = {thread.ident: thread.name for thread in threading.enumerate()}
    wrappers = [wrapper for wrapper in wrappers if wrapper.connection in held]
    made_on = [threads.get(w._thread_ident, f"thread {w._thread_ident}, ended") for w in wrappers]
    chains = "; ".join(_referrer_chain(conn, ignore=held) for conn in held)
    return f"Django connection(s) made on {made_on or 'none'}; {chains}"


def _referrer_chain(obj: Any, *, ignore: list[Any], steps: int = 14) -> str:
    """`obj`'s type, then what refers to it, and so on: at each step the referrers' types and the chain goes
    on through the first of them. Frames count (named by function, file and line): a connection kept by the
    traceback of an exception goes frame <- traceback <- ... <- the exception <- whatever keeps that."""
    chain = [type(obj).__qualname__]
    seen = {id(obj), id(ignore), id(chain)}
    for _ in range(steps):
        found = gc.get_referrers(obj)
        seen.add(id(found))
        referrers = [
            ref
            for ref in found
            if id(ref) not in seen
            and not isinstance(ref, types.GeneratorType)
            and not (isinstance(ref, types.FrameType) and ref.f_code.co_filename == __file__)
        ]
        del found
        if not referrers:
            break
        chain.append(" | ".join(sorted({_describe(ref) for ref in referrers}))[:300])
        seen.add(id(referrers))
        obj = referrers[0]
        seen.add(id(obj))
    return " <- ".join(chain)


def _describe(obj: Any) -> str:
    name = type(obj).__qualname__
    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_name} ({obj.f_code.co_filename.rsplit('/', 2)[-1]}:{obj.f_lineno})"
    if isinstance(obj, dict):
        return f"dict({', '.join(sorted(map(str, list(obj)[:5])))})"
    if isinstance(obj, threading.Thread) or hasattr(obj, "get_name"):
        return f"{name}({getattr(obj, 'name', None) or obj.get_name()})"
    return name


def _threads() -> str:
    """Each live thread of this process, with the innermost frames of its stack."""
    frames = sys._current_frames()
    out = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or 0)
        stack = traceback.format_stack(frame, limit=6) if frame else []
        out.append(f"{thread.name}:\n" + "".join(stack))
    return "\n".join(out)


@pytest.fixture
def redis_down() -> Iterator[None]:
    """Redis unreachable (``tests.live.redis_unreachable``) for the test's own code and requests."""
    from approvals import outage

    with redis_unreachable():
        assert not outage.redis_answers()
        yield


@pytest.fixture
def live_db(transactional_db: None) -> None:
    """A committed test database, visible to the worker and web processes; emptied after the test (past
    the append-only triggers, see ``_flush_past_the_append_only_triggers``)."""


@pytest.fixture(scope="session")
def demo_server(django_db_setup: None) -> Iterator[object]:
    from tests.demo_support import DemoServer

    server = DemoServer(env={"ELICIT_DEMO_TEST_HOOKS": "1"})
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def demo() -> Iterator[object]:
    """A demo MCP server of the module's own (no test hooks), for tests that call it directly."""
    from tests.demo_support import DemoServer

    with DemoServer() as server:
        yield server


@pytest.fixture
def url(demo: Any) -> str:
    """The module's demo server's URL, its state (executions, idempotency cache) reset for each test."""
    from tests.demo_support import reset

    reset(demo.url)
    return str(demo.url)


# Fast retries and short timeouts, so failure paths finish in seconds; every countdown and task time limit
# (run_call's follows ELICIT_MAX_CALL_TIMEOUT) stays below the visibility timeout, after which Redis hands a
# dead worker's task to another (system check approvals.E001, which `migrate` runs).
WORKER_ENV = {
    "ELICIT_VISIBILITY_TIMEOUT": "120",
    "ELICIT_TASK_TIME_LIMIT": "25",
    "ELICIT_MAX_CALL_TIMEOUT": "30",
    "ELICIT_MCP_TIMEOUT": "5",
    "ELICIT_MCP_MAX_RETRIES": "2",
    "ELICIT_MCP_RETRY_BASE": "1",
    "ELICIT_MCP_RETRY_MAX": "2",
    "ELICIT_WEBHOOK_RETRY_MAX": "2",
    "ELICIT_SEND_LEASE": "3",  # a killed worker's calls are free again 3 s later
}


@pytest.fixture(scope="module")
def mcp_test_server() -> Iterator[object]:
    """The MCP test server (tests/mcp_test_server.py) over HTTP: one process per test module."""
    from tests.test_mcp_client import _start

    proc, server = _start([])
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def worker_process(django_db_setup: None, demo_server: object) -> Iterator[CeleryWorker]:
    worker = CeleryWorker(child_env(**WORKER_ENV))
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture
def worker(live_db: None, worker_process: CeleryWorker) -> CeleryWorker:
    """The shared Celery worker, restarted if a previous test killed it."""
    if worker_process.proc is None or worker_process.proc.poll() is not None:
        worker_process.start()
    return worker_process


@pytest.fixture(scope="session")
def web_process(django_db_setup: None) -> Iterator[Daphne]:
    web = Daphne(child_env())
    web.start()
    try:
        yield web
    finally:
        web.stop()


@pytest.fixture
def web(live_db: None, web_process: Daphne) -> Daphne:
    return web_process


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names the outbound guard resolves to the addresses a test gives them (other names: the system's
    resolver). The test machine may have no DNS, and rebinding needs a name whose address changes."""
    from approvals import netguard

    names: dict[str, list[str]] = {}

    def resolve(host: str, port: int) -> list[str]:
        found = names.get(host.lower())
        return list(found) if found is not None else netguard.system_resolver(host, port)

    monkeypatch.setattr(netguard, "resolver", resolve)
    return names
