"""`make run`: engines, migrations, the demo set-up, then Daphne + the MCP gateway (uvicorn) + Celery
(worker and beat) + one holder (the process that keeps handshake-era sessions open) + the demo MCP server
under honcho. One Ctrl-C stops them all, then the embedded engines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from elicit_hub import engines

ROOT = Path(__file__).resolve().parent.parent


def manage(*args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, check=True)


def demo_step(*args: str) -> bool:
    """A demo set-up step: a failure is reported and the hub goes on without it."""
    try:
        manage(*args)
    except subprocess.CalledProcessError as exc:
        print(f"\n  warning: `manage.py {args[0]}` failed (exit {exc.returncode}); the hub goes on.\n")
        return False
    return True


def wait_for(url: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return False


def main() -> int:
    # Development mode for every process started here (DEBUG is off unless set).
    os.environ.setdefault("DJANGO_DEBUG", "true")
    port = os.environ.get("PORT", "8000")
    # The demo MCP server runs on loopback, which the outbound guard refuses unless listed.
    os.environ.setdefault("ELICIT_OUTBOUND_ALLOW", "127.0.0.0/8,::1")
    embedded = not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    if embedded:
        engines.start()
    manage("migrate", "--no-input", "-v", "0")
    demo_step("bootstrap_demo")
    demo_url = os.environ.get("ELICIT_DEMO_MCP_URL", "http://127.0.0.1:8765/mcp")
    env = dict(
        os.environ,
        ELICIT_WEB_PORT=port,
        ELICIT_GATEWAY_PORT=os.environ.get("ELICIT_GATEWAY_PORT", "8001"),
        ELICIT_DEMO_PORT=str(urlsplit(demo_url).port or 8765),
        PYTHON=sys.executable,
    )
    procs = subprocess.Popen([sys.executable, "-m", "honcho", "start", "-f", "Procfile"], cwd=ROOT, env=env)
    try:
        hub = f"http://127.0.0.1:{port}"
        # The demo's health route, not /mcp: a GET there opens a stream that never ends.
        if wait_for(f"{hub}/accounts/login/") and wait_for(demo_url.rsplit("/", 1)[0] + "/healthz"):
            gateway = f"http://127.0.0.1:{env['ELICIT_GATEWAY_PORT']}/mcp"
            print(
                f"\n  Elicit Hub is up: {hub}/  (API docs: {hub}/api/v1/docs; MCP: {gateway})\n", flush=True
            )
            if os.environ.get("ELICIT_DEMO_AGENT", "1") == "1":
                demo_step("demo_agent", "--hub", hub)
        return procs.wait()
    except KeyboardInterrupt:
        return procs.wait()
    finally:
        if procs.poll() is None:
            procs.terminate()
            procs.wait(20)
        if embedded and os.environ.get("ELICIT_KEEP_ENGINES") != "1":
            engines.stop()


if __name__ == "__main__":
    sys.exit(main())
