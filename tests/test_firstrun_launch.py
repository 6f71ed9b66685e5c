"""`make run` as a newcomer meets it: the launcher (`python -m elicit_hub.launch`) on the real engines, its
processes and the demo MCP server."""

from __future__ import annotations

import os
import signal
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from approvals.models import McpServer
from elicit_hub import launch
from tests.live import Process, child_env, free_port, wait_until


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trip wire: the launcher may not migrate, start the engines or start a process."""

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the launcher started something: {args}")

    monkeypatch.setattr(launch, "manage", started)
    monkeypatch.setattr(launch.engines, "start", started)
    monkeypatch.setattr(launch.subprocess, "Popen", started)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


@pytest.mark.usefixtures("nothing_starts")
def test_a_port_in_use_is_named_with_its_setting_before_anything_starts(
    held_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ELICIT_GATEWAY_PORT", str(free_port()))
    monkeypatch.setenv("ELICIT_API_PORT", str(free_port()))
    monkeypatch.setenv("ELICIT_DEMO_MCP_URL", f"http://127.0.0.1:{free_port()}/mcp")
    assert launch.main(["--port", str(held_port)]) == 2
    err = capsys.readouterr().err
    assert f"port {held_port} (web, PORT)" in err
    # The demo server's port is checked as well, and named by the setting that moves it.
    monkeypatch.setenv("ELICIT_DEMO_MCP_URL", f"http://127.0.0.1:{held_port}/mcp")
    assert launch.main(["--port", str(free_port())]) == 2
    assert f"port {held_port} (demo MCP server, ELICIT_DEMO_MCP_URL)" in capsys.readouterr().err


def test_waiting_for_the_hub_stops_once_its_processes_have_stopped() -> None:
    # Nothing listens there and nothing will: the processes that would have answered are gone.
    assert launch.wait_for(f"http://127.0.0.1:{free_port()}/", timeout=3600, alive=lambda: False) is False


@pytest.mark.usefixtures("live_db")
def test_make_run_probes_the_demo_server_once_it_runs(tmp_path: Path) -> None:
    ports = {kind: free_port() for kind in ("web", "gateway", "api", "demo")}
    env = child_env(
        PORT=str(ports["web"]),
        ELICIT_GATEWAY_PORT=str(ports["gateway"]),
        ELICIT_API_PORT=str(ports["api"]),
        ELICIT_DEMO_MCP_URL=f"http://127.0.0.1:{ports['demo']}/mcp",
        # No demo calls: the tools stored must come from registering the server, as the gateway lists them.
        ELICIT_DEMO_AGENT="0",
        # Its own Celery queue and Redis keys (the suite's worker takes none of its tasks), and its own var/.
        ELICIT_NAMESPACE=f"firstrun{uuid.uuid4().hex[:8]}",
        ELICIT_VAR_DIR=str(tmp_path),
        DJANGO_DEBUG="true",
    )
    run = Process("firstrun-launch", [sys.executable, "-m", "elicit_hub.launch"], env)
    run.log_path.unlink(missing_ok=True)
    run.start()
    assert run.proc is not None
    try:
        wait_until(
            lambda: "Elicit Hub is up" in run.log() or run.proc.poll() is not None,  # type: ignore[union-attr]
            180,
            0.5,
            what="the launcher's banner",
        )
        out = run.log()
        assert "Elicit Hub is up" in out, out[-3000:]
        assert "probe: ok: era 2026-07-28" in out, out[-3000:]
        assert "unreachable" not in out
        demo = McpServer.objects.get(slug="demo")
        assert demo.probe is not None and demo.probe["ok"] is True
        assert "create_deployment" in [tool["name"] for tool in demo.tools]
        assert (tmp_path / "Procfile").exists()  # what the launcher writes goes to its var directory
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGINT)  # one Ctrl-C, as in a terminal
            try:
                run.proc.wait(40)
            except Exception:
                run.kill()
