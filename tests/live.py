"""The real processes behind end-to-end tests: a Celery worker and Daphne, on the test database.

Each runs as a subprocess with the environment of the test run, pointed at the database pytest-django
created, so what the test writes (in a transactional test) is what the worker and the web server read.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self
from urllib.parse import quote

import httpx
import uvicorn
from asgiref.sync import SyncToAsync
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "artifacts" / "logs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unreachable_redis_url() -> str:
    """A Redis address with nothing behind it: a port just freed."""
    return f"redis://127.0.0.1:{free_port()}/0"


@contextmanager
def redis_unreachable() -> Iterator[None]:
    """The hub's Redis (its counters, rate limits and wakes, as the cache reaches them) at an address with
    nothing behind it, as in an outage."""
    caches = {"default": {**settings.CACHES["default"], "LOCATION": unreachable_redis_url()}}
    with override_settings(CACHES=caches):
        yield


# How long a test server process may take to answer once started: importing Django and the MCP SDK took
# over 20 s on a machine running two test runs and more beside them. A wait, not a timed test: a server that
# exits fails at once.
STARTUP_WAIT = 60


def start_script(
    script: Path | str, args: list[str], ready: Callable[[], object], what: str
) -> subprocess.Popen[bytes]:
    """A test server script started with `args` (this Python), once `ready()` stops raising ``OSError``
    (it answers), within STARTUP_WAIT s; else the process is killed and the test fails saying `what` did not
    start."""
    proc = subprocess.Popen([sys.executable, str(script), *args])
    deadline = time.monotonic() + STARTUP_WAIT
    while True:
        try:
            ready()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


@contextmanager
def script_mcp_url(script: Path | str, what: str) -> Iterator[str]:
    """The MCP URL of a test server script run as ``python SCRIPT PORT`` on a free loopback port, once its
    ``GET /_ready`` answers; the script is stopped afterwards."""
    base = f"http://127.0.0.1:{free_port()}"

    def ready() -> None:
        urllib.request.urlopen(base + "/_ready", timeout=2).close()

    proc = start_script(script, [base.rsplit(":", 1)[1]], ready, what)
    try:
        yield base + "/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class LoopbackMcpServer:
    """An MCP endpoint (``/mcp``) served in this process on a free loopback port, in a thread, while the
    ``with`` block runs; a subclass answers its requests (`endpoint`)."""

    what = "the loopback MCP server"

    def __init__(self) -> None:
        app = Starlette(routes=[Route("/mcp", self.endpoint, methods=["GET", "POST", "DELETE"])])
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )

    async def endpoint(self, request: Request) -> Response:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> Self:
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 10, 0.02, what=self.what)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class CountingServer:
    """A test MCP server script on a free loopback port that counts what it receives (``GET /_counts``)."""

    def __init__(self, script: Path | str, what: str, *args: str) -> None:
        self.port = free_port()
        self.proc = start_script(script, [str(self.port), *args], self.counts, what)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def counts(self) -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_counts", timeout=2) as response:
            return dict(json.load(response))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def test_database_url() -> str:
    """A DATABASE_URL for the database this test run uses (pytest-django's test database)."""
    s = connection.settings_dict
    host = s.get("HOST") or ""
    port = f":{s['PORT']}" if s.get("PORT") else ""
    password = f":{quote(s['PASSWORD'], safe='')}" if s.get("PASSWORD") else ""
    return (
        f"postgres://{quote(s.get('USER') or '', safe='')}{password}@{quote(host, safe='')}{port}/{s['NAME']}"
    )


def read_only_database_url() -> str:
    """`test_database_url` on connections whose transactions are read-only: the database as a standby
    reached after a failover serves it (reads answer, every write is refused)."""
    return test_database_url() + "?options=" + quote("-c default_transaction_read_only=on", safe="")


def child_env(**extra: str) -> dict[str, str]:
    from django.conf import settings

    env = dict(os.environ)
    env.update(
        DATABASE_URL=test_database_url(),
        REDIS_URL=settings.REDIS_URL,
        ELICIT_NAMESPACE=settings.ELICIT_NAMESPACE,
        DJANGO_SETTINGS_MODULE="elicit_hub.settings",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def release_thread_connections() -> None:
    """Hands back to the pool the connections of the threads that outlive a test: asgiref's one shared thread,
    and the idle request threads of the in-process ASGI handler (``elicit_hub.asgi``, when a test loaded it).

    A test that runs its own event loop (``asyncio.run``, anyio) with no ``async_to_sync`` around it runs its
    ``sync_to_async`` calls on asgiref's thread, which lives for the whole test run. A request the in-process
    handler served ran on one of its pooled threads, which live as long; one whose loop ended before the
    request did never sent ``request_finished``, which closes the request's connection. Either way the
    connection would stay checked out past the test, and past the test database, whose drop then fails
    ("being accessed by other users"). In a server the request thread's next request gives it back."""
    executors = [SyncToAsync.single_thread_executor]
    handler = sys.modules.get("elicit_hub.asgi")
    if handler is not None:
        executors += handler.django_asgi_app.threads.idle_executors()
    for executor in executors:
        if executor._threads:  # not started yet: nothing to give back (a submit would start it)
            executor.submit(connections.close_all).result(timeout=10)


def wait_until(
    predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        time.sleep(interval)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _ends_with(parent: int) -> Callable[[], None] | None:
    """In the child, before it runs: SIGTERM when the test run's process ends, however it ends. A run cut
    short (a time limit's SIGKILL, ^C twice) otherwise leaves its worker behind, still consuming the test
    queue and holding connections to the test database: the next run on the same engines loses tasks to it
    and cannot drop its database.

    The signal follows the *thread* that started the child, not the process: a child started from a helper
    thread gets SIGTERM when that thread ends. Start processes side by side only from threads that live as
    long as the processes do."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the run ended before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Process:
    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"{name}.log"

    def start(self) -> Process:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_ends_with(os.getpid()),
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, the way a crashed machine or the OOM killer stops a worker."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class CeleryWorker(Process):
    """``module`` runs it: ``celery``, or ``tests.fault_worker`` (the same worker with faults injected)."""

    def __init__(self, env: dict[str, str], name: str = "worker", module: str = "celery") -> None:
        super().__init__(
            name,
            [
                sys.executable,
                "-m",
                module,
                "-A",
                "elicit_hub",
                "worker",
                "--pool=solo",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"{name}-{os.getpid()}@%h",
            ],
            env,
        )

    def start(self) -> CeleryWorker:
        before = len(self.log())
        super().start()
        wait_until(lambda: "ready." in self.log()[before:] or self._died(), 60, what="the Celery worker")
        if self._died():
            raise RuntimeError(f"the Celery worker exited:\n{self.log()[-3000:]}")
        return self

    def _died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None


class WebServer(Process):
    """A process serving the hub's HTTP application on ``port``; started once its sign-in page answers."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], port: int) -> None:
        self.port = port
        super().__init__(name, args, env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        super().start()

        def up() -> bool:
            try:
                return httpx.get(self.url + "/accounts/login/", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, what=self.name)
        return self


class Daphne(WebServer):
    """``python -m elicit_hub.serve``: Daphne, HTTP and the websockets."""

    def __init__(self, env: dict[str, str], port: int | None = None) -> None:
        port = port or free_port()
        args = ["-m", "elicit_hub.serve", "-b", "127.0.0.1", "-p", str(port), "elicit_hub.asgi:application"]
        super().__init__("daphne", [sys.executable, *args], env, port)


class ApiServer(WebServer):
    """``python -m elicit_hub.serve_api``: the same HTTP application under uvicorn (no websockets)."""

    def __init__(self, env: dict[str, str], port: int | None = None) -> None:
        port = port or free_port()
        args = ["-m", "elicit_hub.serve_api", "--host", "127.0.0.1", "--port", str(port)]
        super().__init__("api", [sys.executable, *args], env, port)


class HolderRunner(Process):
    """``manage.py run_holder``: the process that keeps handshake-era sessions open."""

    def __init__(self, env: dict[str, str], name: str = "holder") -> None:
        super().__init__(
            name, [sys.executable, "manage.py", "run_holder", "--name", f"{name}-{os.getpid()}"], env
        )

    def start(self) -> HolderRunner:
        before = len(self.log())
        super().start()
        wait_until(lambda: "running (at most" in self.log()[before:] or self._died(), 60, what="the holder")
        if self._died():
            raise RuntimeError(f"the holder exited:\n{self.log()[-3000:]}")
        return self

    def _died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None
