"""`make run`'s launcher and the engines' command line when something is wrong: a port the demo server shares
with the hub, engines that cannot start, a database that does not answer. One clear sentence and a non-zero
exit, before anything is left running; never a traceback of the launcher's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from elicit_hub.launch import parse_layout
from tests.live import free_port

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--port", "8764", "--web", "2"], {}),  # web2 on the demo server's default port
        ([], {"ELICIT_DEMO_MCP_URL": "http://127.0.0.1:8001/mcp"}),  # the gateway's
        ([], {"ELICIT_DEMO_MCP_URL": "http://127.0.0.1:9100/mcp", "ELICIT_API_PORT": "9100"}),
    ],
)
def test_the_demo_server_may_not_share_a_port_with_the_hub(
    argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_layout(argv, env)
    assert exit_.value.code == 2
    assert "the demo MCP server's port" in capsys.readouterr().err


def launched(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "ELICIT_VAR_DIR")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def free_ports() -> dict[str, str]:
    """Ports for every process of one of each kind, so the launcher's own port check passes."""
    return {
        "PORT": str(free_port()),
        "ELICIT_GATEWAY_PORT": str(free_port()),
        "ELICIT_API_PORT": str(free_port()),
        "ELICIT_DEMO_MCP_URL": f"http://127.0.0.1:{free_port()}/mcp",
    }


def test_engines_that_cannot_start_stop_the_launcher_with_one_sentence(tmp_path: Path) -> None:
    nowhere = "/proc/elicit-hub-cannot-be-here"
    done = launched("-m", "elicit_hub.launch", ELICIT_VAR_DIR=nowhere, **free_ports())
    assert done.returncode == 1, done.stderr[-2000:]
    assert "The hub did not start: the embedded engines did not start:" in done.stderr
    assert "Traceback" not in done.stderr
    engines = launched("-m", "elicit_hub.engines", "start", ELICIT_VAR_DIR=nowhere)
    assert engines.returncode == 1
    assert engines.stderr.startswith("engines start: ") and "Traceback" not in engines.stderr


def test_a_database_that_does_not_answer_stops_the_launcher_after_the_migrations_error() -> None:
    closed = f"postgres://postgres@127.0.0.1:{free_port()}/nothing"
    done = launched(
        "-m",
        "elicit_hub.launch",
        DATABASE_URL=closed,
        REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        ELICIT_DB_POOL_MAX="0",
        **free_ports(),
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "The hub did not start: `manage.py migrate` failed (exit 1); its error is above" in done.stderr
    # The only traceback is the migration's own (Django's): none of the launcher's after it.
    assert "CalledProcessError" not in done.stderr and "elicit_hub/launch.py" not in done.stderr


def test_the_engines_command_line_answers_help() -> None:
    done = launched("-m", "elicit_hub.engines", "--help")
    assert done.returncode == 0 and "start|stop|status|env" in done.stdout
