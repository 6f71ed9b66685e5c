"""`make run`: engines, migrations, the demo set-up, then the hub's processes under honcho: Daphne (web), the
MCP gateway (uvicorn), the API server (uvicorn: the same HTTP application, for /api/), Celery workers (the
first also runs beat), holders (the processes that keep handshake-era sessions open) and the demo MCP
server. One Ctrl-C stops them all, then the embedded engines.

One of each by default. More of a kind, on one machine and one PostgreSQL + Redis:

    .venv/bin/python -m elicit_hub.launch --web 2 --api 2 --workers 2 --holders 2   # or ELICIT_WEB=2 ...
    .venv/bin/python -m elicit_hub.launch --web 2 --procfile    # print the process list, start nothing

Web processes listen on consecutive ports from PORT (8000), then the gateways on the ports after them
(unless ELICIT_GATEWAY_PORT says where the first one goes), then the API servers (unless ELICIT_API_PORT
says). `--api 0` starts none: Daphne serves /api/ as well, as it always does. A reverse proxy spreads
clients across them (README: "Running more than one process").
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg

from elicit_hub import engines

ROOT = Path(__file__).resolve().parent.parent
MAX_PER_KIND = 32


@dataclass(frozen=True)
class Layout:
    """How many processes of each kind, and where the first web and gateway processes listen."""

    web: int = 1
    workers: int = 1
    holders: int = 1
    gateways: int = 1
    api: int = 1
    port: int = 8000
    gateway_port: int | None = None
    api_port: int | None = None
    worker_concurrency: int = 4
    demo_port: int | None = 8765

    def __post_init__(self) -> None:
        for kind in ("web", "workers", "gateways"):
            if not 1 <= getattr(self, kind) <= MAX_PER_KIND:
                raise ValueError(f"--{kind} must be between 1 and {MAX_PER_KIND}")
        for kind in ("holders", "api"):
            if not 0 <= getattr(self, kind) <= MAX_PER_KIND:
                raise ValueError(f"--{kind} must be between 0 and {MAX_PER_KIND}")
        if self.worker_concurrency < 1:
            raise ValueError("--worker-concurrency must be at least 1")
        taken = set(self.web_ports) & set(self.gateway_ports)
        if taken:
            raise ValueError(f"the gateway ports overlap the web ports: {sorted(taken)}")
        taken = set(self.api_ports) & {*self.web_ports, *self.gateway_ports}
        if taken:
            raise ValueError(f"the API ports overlap the web or gateway ports: {sorted(taken)}")
        if not all(0 < port < 65536 for port in [*self.web_ports, *self.gateway_ports, *self.api_ports]):
            raise ValueError("ports must lie between 1 and 65535")
        if self.demo_port in {*self.web_ports, *self.gateway_ports, *self.api_ports}:
            # Both would start and one fail to listen, which stops every process of the hub.
            raise ValueError(
                f"the demo MCP server's port {self.demo_port} (ELICIT_DEMO_MCP_URL) is one of the hub's own"
            )

    @property
    def web_ports(self) -> list[int]:
        return [self.port + i for i in range(self.web)]

    @property
    def gateway_ports(self) -> list[int]:
        first = self.gateway_port if self.gateway_port is not None else self.port + self.web
        return [first + i for i in range(self.gateways)]

    @property
    def api_ports(self) -> list[int]:
        first = self.api_port if self.api_port is not None else self.gateway_ports[-1] + 1
        return [first + i for i in range(self.api)]

    def ports(self) -> list[tuple[int, str]]:
        """Every port this layout listens on, with the process that wants it and the setting that moves it."""
        wanted = [(port, "web", "PORT") for port in self.web_ports]
        wanted += [(port, "MCP gateway", "ELICIT_GATEWAY_PORT") for port in self.gateway_ports]
        wanted += [(port, "API server", "ELICIT_API_PORT") for port in self.api_ports]
        if self.demo_port is not None:
            wanted.append((self.demo_port, "demo MCP server", "ELICIT_DEMO_MCP_URL"))
        return [(port, f"{port} ({what}, {setting})") for port, what, setting in wanted]

    @property
    def web_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.web_ports]

    @property
    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.api_ports]


def commands(layout: Layout, python: str = sys.executable) -> dict[str, list[str]]:
    """Each process's name and command line: `kind` when there is one of a kind, else `kindN` (honcho
    allows no dots in a name)."""

    def named(kind: str, count: int) -> list[str]:
        return [kind] if count == 1 else [f"{kind}{i}" for i in range(1, count + 1)]

    procs: dict[str, list[str]] = {}
    for name, port in zip(named("web", layout.web), layout.web_ports, strict=True):
        procs[name] = [python, "-m", "elicit_hub.serve", "-b", "127.0.0.1", "-p", str(port)]
        procs[name].append("elicit_hub.asgi:application")
    for name, port in zip(named("gateway", layout.gateways), layout.gateway_ports, strict=True):
        procs[name] = [python, "manage.py", "run_gateway", "--host", "127.0.0.1", "--port", str(port)]
    for name, port in zip(named("api", layout.api), layout.api_ports, strict=True):
        procs[name] = [python, "-m", "elicit_hub.serve_api", "--host", "127.0.0.1", "--port", str(port)]
    for name in named("holder", layout.holders):
        procs[name] = [python, "manage.py", "run_holder"]
    for i, name in enumerate(named("worker", layout.workers)):
        # No --loglevel: the worker follows ELICIT_LOG_LEVEL (elicit_hub.celery), as the other processes do.
        worker = [python, "-m", "celery", "-A", "elicit_hub", "worker"]
        worker += [f"--concurrency={layout.worker_concurrency}", "-n", f"{name}@%h"]
        if i == 0:  # beat runs exactly once, whatever the number of workers
            worker += ["--beat", f"--schedule={_in_var('celerybeat-schedule')}"]
        procs[name] = worker
    if layout.demo_port is not None:
        procs["demo"] = [
            python,
            "-m",
            "approvals.demo",
            "--host",
            "127.0.0.1",
            "--port",
            str(layout.demo_port),
        ]
    return procs


def _in_var(name: str) -> Path:
    """A file in the var directory (ELICIT_VAR_DIR, else ./var): relative to the checkout, where the processes
    run, when it lies inside it."""
    path = engines.VAR_DIR / name
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def procfile(layout: Layout, python: str = sys.executable) -> str:
    return "".join(f"{name}: {shlex.join(cmd)}\n" for name, cmd in commands(layout, python).items())


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


def stop_engines(embedded: bool) -> None:
    """Stop the embedded engines (when the hub uses them) unless ELICIT_KEEP_ENGINES=1; a failure is reported,
    not raised."""
    if not embedded or os.environ.get("ELICIT_KEEP_ENGINES") == "1":
        return
    try:
        engines.stop()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"\n  warning: the embedded engines did not stop: {exc}\n", file=sys.stderr)


def prepare(embedded: bool) -> str | None:
    """Start the embedded engines (when `embedded`) and migrate: None, or why the hub cannot start (once,
    in a sentence, rather than a traceback after the migration's own error)."""
    try:
        if embedded:
            engines.start()
    except (RuntimeError, OSError, subprocess.SubprocessError, psycopg.Error) as exc:
        return f"the embedded engines did not start: {exc}"
    try:
        manage("migrate", "--no-input", "-v", "0")
    except subprocess.CalledProcessError as exc:
        return f"`manage.py migrate` failed (exit {exc.returncode}); its error is above"
    return None


def ports_in_use(layout: Layout) -> list[str]:
    """The ports of `layout` that another program holds on 127.0.0.1, each named with its process and setting:
    checked before anything starts, since a server that cannot listen stops every process of the hub, and
    another program answering on the web port would pass for the hub."""
    taken = []
    for port, shown in layout.ports():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As the servers bind: a port left in TIME_WAIT by an earlier run is free to them.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                taken.append(shown)
    return taken


def wait_for(url: str, timeout: float = 60.0, alive: Callable[[], bool] = lambda: True) -> bool:
    """Whether `url` answers (below 500) within `timeout` seconds; False at once when `alive()` turns false
    (the hub's processes stopped: nothing will answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return False


def first_silent(urls: list[str], alive: Callable[[], bool], timeout: float = 60.0) -> str | None:
    """The first of `urls` that does not answer within `timeout` seconds (each waited for in turn), or None
    when all answer."""
    return next((url for url in urls if not wait_for(url, timeout, alive)), None)


def _count(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None


def parse_layout(argv: list[str], environ: os._Environ[str] | dict[str, str]) -> tuple[Layout, bool]:
    """The layout from the command line, else the environment (ELICIT_WEB, ELICIT_WORKERS, ELICIT_HOLDERS,
    ELICIT_GATEWAYS, ELICIT_API, PORT, ELICIT_GATEWAY_PORT, ELICIT_API_PORT), else one of each; and whether
    only to print it."""
    parser = argparse.ArgumentParser(prog="python -m elicit_hub.launch", description=__doc__.split("\n")[0])

    def option(flag: str, variable: str, default: int, what: str) -> None:
        parser.add_argument(
            flag,
            type=_count,
            # argparse converts a string default with `type`: a bad variable is reported like a bad flag
            default=environ.get(variable) or str(default),
            help=f"{what} ({variable})",
        )

    option("--web", "ELICIT_WEB", 1, "web (Daphne) processes")
    option("--workers", "ELICIT_WORKERS", 1, "Celery worker processes; the first also runs beat")
    option("--holders", "ELICIT_HOLDERS", 1, "holder processes")
    option("--gateways", "ELICIT_GATEWAYS", 1, "MCP gateway processes")
    option("--api", "ELICIT_API", 1, "API server (uvicorn) processes; 0: Daphne serves /api/ too")
    option("--worker-concurrency", "ELICIT_WORKER_CONCURRENCY", 4, "Celery pool size of each worker")
    option("--port", "PORT", 8000, "the first web process's port")
    parser.add_argument("--procfile", action="store_true", help="print the processes as a Procfile and exit")
    parser.add_argument(
        "--no-demo",
        action="store_true",
        help="no demo MCP server, demo set-up or demo calls (e.g. a --procfile for a deployment)",
    )
    args = parser.parse_args(argv)
    gateway_port = environ.get("ELICIT_GATEWAY_PORT")
    api_port = environ.get("ELICIT_API_PORT")
    demo_url = environ.get("ELICIT_DEMO_MCP_URL", "http://127.0.0.1:8765/mcp")
    try:
        layout = Layout(
            web=args.web,
            workers=args.workers,
            holders=args.holders,
            gateways=args.gateways,
            api=args.api,
            worker_concurrency=args.worker_concurrency,
            port=args.port,
            gateway_port=_count(gateway_port) if gateway_port else None,
            api_port=_count(api_port) if api_port else None,
            demo_port=None if args.no_demo else urlsplit(demo_url).port or 8765,
        )
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    return layout, args.procfile


def main(argv: list[str] | None = None) -> int:
    layout, only_print = parse_layout(sys.argv[1:] if argv is None else argv, os.environ)
    if only_print:
        print(procfile(layout), end="")
        return 0
    taken = ports_in_use(layout)
    if taken:
        print(
            f"Another program already listens on 127.0.0.1 port {', '.join(taken)}. Stop it, or give the hub "
            "another port with the setting named; the gateway and API ports follow PORT unless set.",
            file=sys.stderr,
        )
        return 2
    # Development mode for every process started here (DEBUG is off unless set).
    os.environ.setdefault("DJANGO_DEBUG", "true")
    # The demo MCP server runs on loopback, which the outbound guard refuses unless listed.
    os.environ.setdefault("ELICIT_OUTBOUND_ALLOW", "127.0.0.0/8,::1")
    # As manage.py, which starts both unless both are set.
    embedded = not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    try:
        problem = prepare(embedded)
    except KeyboardInterrupt:  # Ctrl-C while the engines start or the migrations run
        problem = "interrupted"
    if problem:
        print(f"\n  The hub did not start: {problem}\n", file=sys.stderr)
        stop_engines(embedded)
        return 130 if problem == "interrupted" else 1
    demo_url = os.environ.get("ELICIT_DEMO_MCP_URL", "http://127.0.0.1:8765/mcp")
    generated = engines.VAR_DIR / "Procfile"
    generated.parent.mkdir(parents=True, exist_ok=True)
    generated.write_text(procfile(layout))
    procs = subprocess.Popen(
        [sys.executable, "-m", "honcho", "start", "-d", str(ROOT), "-f", str(generated)], cwd=ROOT
    )
    try:

        def running() -> bool:
            return procs.poll() is None

        hubs, apis = layout.web_urls, layout.api_urls
        gateways = [f"http://127.0.0.1:{port}" for port in layout.gateway_ports]
        # The demo's health route, not /mcp: a GET there opens a stream that never ends.
        urls = [f"{hub}/accounts/login/" for hub in [*hubs, *apis]]
        urls += [f"{gateway}/healthz" for gateway in gateways]
        if layout.demo_port is not None:
            urls.append(demo_url.rsplit("/", 1)[0] + "/healthz")
        silent = first_silent(urls, running)
        if not running():
            print("\n  The hub's processes stopped before it answered: the first error above says why.\n")
            return procs.wait()
        up = silent is None
        if not up:
            print(
                f"\n  warning: {silent} did not answer within a minute; the hub's processes still run (their "
                "output is above). Ctrl-C stops them.\n",
                flush=True,
            )
        # The demo server is registered once it answers, so its probe stores its era and tools (the gateway
        # lists stored tools) instead of "unreachable"; and the demo login shows just above the banner.
        if layout.demo_port is not None:
            demo_step("bootstrap_demo")
        if up:
            mcp = ", ".join(f"{gateway}/mcp" for gateway in gateways)
            web = ", ".join(f"{hub}/" for hub in hubs)
            api = "".join(f", also {url}/api/" for url in apis)
            print(
                f"\n  Elicit Hub is up: {web}  (API docs: {hubs[0]}/api/v1/docs{api}; MCP: {mcp})\n",
                flush=True,
            )
            if layout.demo_port is not None and os.environ.get("ELICIT_DEMO_AGENT", "1") == "1":
                demo_step("demo_agent", "--hub", hubs[0])
        return procs.wait()
    except KeyboardInterrupt:
        return procs.wait()
    finally:
        if procs.poll() is None:
            procs.terminate()
            procs.wait(20)
        stop_engines(embedded)


if __name__ == "__main__":
    sys.exit(main())
