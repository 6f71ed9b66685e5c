"""The benchmarks' processes: start the hub's own commands, wait for them, read their CPU and memory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management.base import CommandError

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "var" / "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def hub_env(*, debug: bool = False, **extra: str) -> dict[str, str]:
    """The environment of the hub processes a benchmark starts: as deployed (DEBUG off) unless `debug`.

    With DEBUG on, Django keeps and formats every SQL statement it runs (a tenth of a worker's CPU here), so
    the figures would not be what a deployment sees. Off, the processes get this checkout's own secret key
    (so the sessions the benchmark signs in with verify), loopback hosts, and no HTTPS redirect: plain HTTP
    on 127.0.0.1, as behind a reverse proxy that ends TLS.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra, "DJANGO_DEBUG": "true" if debug else "false"}
    if not debug:
        env.setdefault("DJANGO_SECRET_KEY", settings.SECRET_KEY)
        env.setdefault("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")
        env.setdefault("DJANGO_SECURE_SSL_REDIRECT", "false")
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...); None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` so far, in seconds (fields 14 and 15 of /proc/<pid>/stat); 0 once gone."""
    fields = stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its living descendants (a prefork Celery worker's pool children)."""
    total = 0.0
    for one in [pid, *descendants(pid)]:
        try:
            total += cpu_seconds(one)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return found
    for child in map(int, children):
        found += [child, *descendants(child)]
    return found


def memory_kib(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmRSS", "VmHWM", "Threads"}:
            found[key] = int(value.split()[0])
    return found


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.TransportError:
        return False
    return True


class Proc:
    """One child process, its output in var/bench/NAME.log, stopped by SIGTERM (then SIGKILL)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOGS / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, ready: Callable[[], object], what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise CommandError(f"{self.name} exited:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise CommandError(f"{what} not ready after {timeout:.0f} s:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
