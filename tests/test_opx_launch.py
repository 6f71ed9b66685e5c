"""`make run` interrupted: Ctrl-C while the engines start or the migrations run stops the embedded engines
(no launcher traceback, nothing left running)."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from elicit_hub import engines, launch
from tests.live import ROOT, free_port

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def var_dir() -> Iterator[Path]:
    # Under ./var with a short name: the embedded Redis's socket path stays under 108 bytes.
    engines.VAR_DIR.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ln-", dir=engines.VAR_DIR))
    try:
        yield root
    finally:
        engines.Redis(root=root / "redis").stop()
        engines.Postgres(root=root / "pg").stop()
        shutil.rmtree(root)


@pytest.fixture
def silent_database() -> Iterator[socket.socket]:
    """A "PostgreSQL" that takes connections and never answers: `migrate` waits on it until interrupted."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(120)
        yield server


def test_ctrl_c_during_the_migrations_stops_the_engines_the_launcher_started(
    var_dir: Path, silent_database: socket.socket
) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_DEBUG", "ELICIT_KEEP_ENGINES")
    }
    env.update(
        ELICIT_VAR_DIR=str(var_dir),
        # A database that never answers, and no REDIS_URL: the embedded engines start.
        DATABASE_URL=f"postgres://nobody@127.0.0.1:{silent_database.getsockname()[1]}/nothing",
        ELICIT_DB_POOL_MAX="0",
        PORT=str(free_port()),
        ELICIT_GATEWAY_PORT=str(free_port()),
        ELICIT_API_PORT=str(free_port()),
        ELICIT_DEMO_MCP_URL=f"http://127.0.0.1:{free_port()}/mcp",
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "elicit_hub.launch"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches
    )
    try:
        connection, _ = silent_database.accept()  # the migrations have begun, the engines are up
        assert engines.Redis(root=var_dir / "redis").is_running()
        os.killpg(launcher.pid, signal.SIGINT)
        out, err = launcher.communicate(timeout=120)
        connection.close()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()

    assert launcher.returncode == 130, out + err
    assert "The hub did not start: interrupted" in err
    assert "elicit_hub/launch.py" not in err  # no traceback of the launcher's own
    assert not engines.Redis(root=var_dir / "redis").is_running()
    assert not engines.Postgres(root=var_dir / "pg").is_running()


def test_the_api_server_refuses_a_port_it_cannot_listen_on() -> None:
    # uvloop listened on whatever 70000 wraps to (4464) and said it listened on 70000.
    done = subprocess.run(
        [sys.executable, "-m", "elicit_hub.serve_api", "--port", "70000"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_DEBUG": "true"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "argument --port: 70000 is not a port (1 to 65535)" in done.stderr


def test_manage_py_says_in_one_line_why_the_embedded_engines_did_not_start(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)  # too deep for a unix socket's path
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**env, "DJANGO_DEBUG": "true", "ELICIT_VAR_DIR": str(deep)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("manage.py: the embedded engines did not start: ")
    assert "ELICIT_VAR_DIR" in line


@pytest.fixture
def answering_url() -> Iterator[str]:
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()


def test_the_launcher_names_the_process_that_did_not_answer(
    answering_url: str, silent_database: socket.socket
) -> None:
    """`make run` printed neither its banner nor a word when a process took longer than a minute to answer;
    now it names the one it waited for in vain."""
    silent = (
        f"http://127.0.0.1:{silent_database.getsockname()[1]}/healthz"  # takes connections, never answers
    )
    assert (
        launch.first_silent([answering_url, silent, answering_url], alive=lambda: True, timeout=2) == silent
    )
    assert launch.first_silent([answering_url, answering_url], alive=lambda: True, timeout=2) is None


def test_a_procfile_for_a_deployment_leaves_the_demo_server_out() -> None:
    """`--procfile` prints the commands to run on other machines; the demo MCP server is no part of them."""
    layout, only_print = launch.parse_layout(["--web", "2", "--no-demo", "--procfile"], {})
    assert only_print and layout.demo_port is None
    printed = launch.procfile(layout, "py")
    assert "approvals.demo" not in printed and "demo:" not in printed
    assert [line.split(":")[0] for line in printed.splitlines()] == [
        "web1",
        "web2",
        "gateway",
        "api",
        "holder",
        "worker",
    ]
    # Its port is then no port of the launcher's, even one the hub's own processes would use.
    layout, _ = launch.parse_layout(["--no-demo"], {"ELICIT_DEMO_MCP_URL": "http://127.0.0.1:8001/mcp"})
    assert all("demo" not in shown for _, shown in layout.ports())
