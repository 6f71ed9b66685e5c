"""The embedded engines on an operator's machine: what a server that died leaves behind (a pid file naming a
process that is now another program's) is never acted on. Each test runs its own Redis beside the suite's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from elicit_hub import engines

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def redis_root() -> Iterator[Path]:
    # A short path under ./var keeps the socket's under 108 bytes.
    engines.VAR_DIR.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rd-", dir=engines.VAR_DIR))
    try:
        yield root / "redis"
    finally:
        engines.Redis(root=root / "redis").stop()
        shutil.rmtree(root)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """Another program of the same user, running under the number a dead server's pid file still holds."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_stopping_after_redis_died_leaves_the_process_its_pid_file_names_alone(
    redis_root: Path, bystander: subprocess.Popen[bytes]
) -> None:
    redis = engines.Redis(root=redis_root)
    redis_root.mkdir(parents=True)
    redis.pidfile.write_text(f"{bystander.pid}\n")  # the server died (killed, a reboot) and left its pid file

    redis.stop()

    assert bystander.poll() is None, "`engines stop` signalled a process that is not the hub's Redis"
    assert not redis.pidfile.exists()  # the stale file is gone, so the next stop does not read it again


def test_a_running_redis_is_stopped_and_started_again(redis_root: Path) -> None:
    redis = engines.Redis(root=redis_root)
    redis.start()
    assert redis.is_running()
    redis.start()  # already up: nothing else starts on its socket
    assert len(redis.pidfile.read_text().split()) == 1

    redis.stop()

    assert not redis.is_running() and not redis.pidfile.exists()
    redis.stop()  # stopped already: nothing to do, no error
    redis.start()
    assert redis.is_running()


@pytest.fixture
def cluster_root() -> Iterator[Path]:
    engines.VAR_DIR.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pg-", dir=engines.VAR_DIR))
    try:
        yield root / "pg"
    finally:
        engines.Postgres(root=root / "pg").stop()
        shutil.rmtree(root)


def launcher_says(var_dir: Path) -> str:
    """What `python -m elicit_hub.engines start` prints for the engines under `var_dir`."""
    done = subprocess.run(
        [sys.executable, "-m", "elicit_hub.engines", "start"],
        cwd=engines.BASE_DIR,
        env={**os.environ, "ELICIT_VAR_DIR": str(var_dir)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def test_a_data_directory_of_another_postgresql_version_is_named_with_what_to_do(cluster_root: Path) -> None:
    pg = engines.Postgres(root=cluster_root)
    pg.start()
    pg.stop()
    (pg.data / "PG_VERSION").write_text("15\n")  # a ./var kept from a hub that shipped PostgreSQL 15

    said = launcher_says(cluster_root.parent)

    assert f"{pg.data} was made by PostgreSQL 15, and the embedded server is PostgreSQL 16" in said
    assert "pg_dumpall" in said and str(cluster_root) in said
    assert not pg.is_running()


def test_a_server_that_will_not_start_says_why_and_where_its_log_is(cluster_root: Path) -> None:
    pg = engines.Postgres(root=cluster_root)
    pg.start()
    pg.stop()
    (pg.data / "global" / "pg_control").write_bytes(b"broken")  # a damaged cluster

    said = launcher_says(cluster_root.parent)

    # The server's own reason, from its log, not pg_ctl's "Examine the log output".
    assert said.startswith("engines start: PostgreSQL did not start: ")
    assert 'could not read file "global/pg_control"' in said and f"(see {pg.log})" in said
    assert "Examine the log output" not in said


@pytest.fixture
def server_users_bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A program of the user the embedded PostgreSQL runs as (the hub's, or the service user under root),
    which pg_ctl could signal."""
    service = engines._service_user()
    if service is None:
        process = subprocess.Popen(["sleep", "120"], cwd="/")
    else:
        process = subprocess.Popen(
            ["sleep", "120"], cwd="/", user=service.pw_uid, group=service.pw_gid, extra_groups=[]
        )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_postgres_after_a_crash_leaves_the_process_its_lock_file_names_alone_and_starts(
    cluster_root: Path, server_users_bystander: subprocess.Popen[bytes]
) -> None:
    pg = engines.Postgres(root=cluster_root)
    pg.start()
    pg.stop()
    # The server died (killed, a reboot) and left its lock file; its number now belongs to another program.
    lock = pg.data / "postmaster.pid"
    lock.write_text(f"{server_users_bystander.pid}\n{pg.data}\n1700000000\n5432\n{pg.socket_dir}\n\n")

    pg.stop()
    assert server_users_bystander.poll() is None, "`engines stop` signalled a process that is not PostgreSQL"

    pg.start()  # not refused as "another postmaster is running"
    assert server_users_bystander.poll() is None
    assert pg.is_running()
    with pg.connect(database=engines.HUB_DATABASE) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("engine", [engines.Postgres, engines.Redis])
def test_a_var_directory_too_deep_for_a_socket_is_named_before_anything_starts(
    engine: type[engines.Postgres] | type[engines.Redis], tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 100)  # a checkout deep in a home directory
    server = engine(root=deep / "engine")
    with pytest.raises(RuntimeError, match="set ELICIT_VAR_DIR to a shorter directory") as refused:
        server.start()
    assert "at most 107" in str(refused.value)
    assert not deep.exists()  # nothing was made, nothing runs


def test_a_redis_whose_socket_was_removed_is_still_stopped(redis_root: Path) -> None:
    redis = engines.Redis(root=redis_root)
    redis.start()
    pid = int(redis.pidfile.read_text())
    redis.socket.unlink()  # a clean-up script, or a hand, removed it: nothing answers there now

    redis.stop()

    assert not engines._alive(pid)
    assert not redis.pidfile.exists()
