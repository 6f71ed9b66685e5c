"""The embedded PostgreSQL is private to the hub's user: password auth, a socket directory no one else can
enter, secrets only its user can read, a hub role that is not a superuser; and a data directory of the
earlier, trusting layout is converted on the next start. Each test runs its own cluster beside the suite's."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from elicit_hub import engines


@pytest.fixture
def cluster_root() -> Iterator[Path]:
    # Under ./var, which the server's user can already reach; a short path keeps the socket's under 108 bytes.
    engines.VAR_DIR.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pg-", dir=engines.VAR_DIR))
    try:
        yield root / "pg"
    finally:
        engines.Postgres(root=root / "pg").stop()
        shutil.rmtree(root)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def refused_without_the_password(pg: engines.Postgres, user: str) -> None:
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host=str(pg.socket_dir), user=user, dbname="postgres", connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host=str(pg.socket_dir), user=user, dbname="postgres", password="guess", connect_timeout=10
        )


def assert_private(pg: engines.Postgres) -> None:
    for secret in (pg.hub_password_file, pg.superuser_password_file):
        assert mode(secret) == 0o600 and secret.stat().st_uid == os.getuid()
        assert len(secret.read_text().strip()) >= 32
    assert (pg.data / "pg_hba.conf").read_text() == engines.HBA
    service = engines._service_user()
    if service is None:  # the server runs as the hub's own user: only that user may enter
        assert mode(pg.root) == 0o700 and mode(pg.socket_dir) == 0o700
        return
    # Run as root: the server's user may search var/pg, root's group may enter the socket directory.
    assert (mode(pg.root), pg.root.stat().st_uid, pg.root.stat().st_gid) == (0o710, 0, service.pw_gid)
    run = pg.socket_dir.stat()
    assert (mode(pg.socket_dir), run.st_uid, run.st_gid) == (0o750, service.pw_uid, os.getgid())
    # And another local user cannot even reach the socket, password or not.
    nobody = pwd.getpwnam("nobody")
    result = subprocess.run(
        [pg.bin / "psql", "-h", str(pg.socket_dir), "-U", "postgres", "-d", "postgres", "-c", "SELECT 1"],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        cwd="/",
        env={"PGCONNECT_TIMEOUT": "10", "PGPASSWORD": pg.superuser_password_file.read_text().strip()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "Permission denied" in result.stderr


def hub_role(pg: engines.Postgres) -> tuple[bool, bool, bool, str]:
    with pg.connect(database=engines.HUB_DATABASE) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, pg_get_userbyid(d.datdba) "
            "FROM pg_roles, pg_database d WHERE rolname = current_user AND d.datname = current_database()"
        ).fetchone()
    assert row is not None
    return row


def test_a_fresh_embedded_postgres_wants_passwords_and_the_hub_is_no_superuser(cluster_root: Path) -> None:
    pg = engines.Postgres(root=cluster_root)
    pg.start()
    assert_private(pg)
    refused_without_the_password(pg, engines.HUB_ROLE)
    refused_without_the_password(pg, engines.SUPERUSER)
    assert hub_role(pg) == (False, False, True, engines.HUB_ROLE)
    assert engines.HUB_ROLE in pg.url() and pg.hub_password_file.read_text().strip() in pg.url()
    with pg.connect(superuser=True) as conn:  # the superuser, explicitly, with its own password
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row == (True,)
    pg.stop()
    pg.start()  # a restart keeps the same secrets and needs no second conversion
    assert hub_role(pg)[0] is False


def start_the_earlier_way(pg: engines.Postgres) -> None:
    """What engines.start did before: trust auth, the socket in var/pg itself, open to every local user,
    the hub's tables owned by the superuser."""
    run_as = engines._service_user()
    pg.root.mkdir(parents=True)
    if run_as:
        engines._grant_traversal(pg.root.parent)
        shutil.chown(pg.root, run_as.pw_uid, run_as.pw_gid)
    engines._run(
        [pg.bin / "initdb", "-D", pg.data, "-U", "postgres", "--auth=trust", "--locale=C.UTF-8"], run_as
    )
    options = f"-k {pg.root} -c listen_addresses='' -c unix_socket_permissions=0777"
    log = pg.root / "postgres.log"
    engines._run([pg.bin / "pg_ctl", "-D", pg.data, "-l", log, "-o", options, "-w", "start"], run_as)
    with psycopg.connect(host=str(pg.root), user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute("CREATE DATABASE elicit_hub")
    with psycopg.connect(host=str(pg.root), user="postgres", dbname="elicit_hub", autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, note text)")
        conn.execute("CREATE SEQUENCE loose_seq")
        conn.execute(
            "CREATE FUNCTION kept_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM kept'"
        )
        conn.execute("INSERT INTO kept (note) VALUES ('from before')")


def test_an_earlier_trusting_cluster_is_converted_on_the_next_start(cluster_root: Path) -> None:
    pg = engines.Postgres(root=cluster_root)
    start_the_earlier_way(pg)
    pg.start()  # while the earlier server still runs
    assert_private(pg)
    assert not list(pg.root.glob(".s.PGSQL.*"))
    refused_without_the_password(pg, engines.SUPERUSER)
    assert hub_role(pg) == (False, False, True, engines.HUB_ROLE)
    with pg.connect(database=engines.HUB_DATABASE, autocommit=True) as conn:
        owners = conn.execute(
            "SELECT relname, pg_get_userbyid(relowner) FROM pg_class WHERE relname IN "
            "('kept', 'kept_id_seq', 'loose_seq') ORDER BY relname"
        ).fetchall()
        assert owners == [("kept", "elicit_hub"), ("kept_id_seq", "elicit_hub"), ("loose_seq", "elicit_hub")]
        conn.execute("INSERT INTO kept (note) VALUES ('after')")
        assert conn.execute("SELECT kept_count(), nextval('loose_seq')").fetchone() == (2, 1)
        assert conn.execute(
            "SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE proname = 'kept_count'"
        ).fetchone() == ("elicit_hub",)
