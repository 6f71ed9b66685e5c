"""The load benchmark (issue 15): the whole loop through the API, under load, with CPU per call.

Starts the hub the way `make run` does (elicit_hub.launch's processes but the demo: web, gateway, API
server, holder, worker; ``--web-processes N --api-processes A --workers M --holders K`` for more of a kind),
on the engines the settings name (the embedded ones unless DATABASE_URL / REDIS_URL are set), or uses a hub
already running (``--web URL``, repeatable: agents and reviewers are spread across them; ``--api URL`` for
the API servers, if any). The API's requests go to the API servers (uvicorn) as the reverse proxy sends
them; the sockets to the web processes (Daphne). ``--api-processes 0``: Daphne serves both, as before. The
MCP server is always a separate process (bench/load_server.py: the demo server, whose ``create_deployment``
asks once and completes on the retry, and which notes when each retry arrived).

Load: ``--agents`` agents (8) each submit one-round calls and long-poll each for its result;
``--reviewers`` bot reviewers (2) long-poll ``GET /api/v1/inbox`` (or poll it every ``--poll`` ms) and
answer (each answers its share of the items), and each keeps a websocket open on the queue. Closed loop
(each agent submits its next call once the last one ended: the maximum throughput) unless ``--rate R``
offers R calls/s in all.
It runs ``--duration`` seconds (or ``--calls`` calls) after ``--warmup`` seconds that are not counted.

Prints: calls/s and errors; submit -> visible in the inbox; input_required received (the stored
Round.opened_at) -> visible to a reviewer, in the inbox and on the socket; answer POST -> retry received
by the MCP server; the CPU time per completed call of each hub process kind (utime + stime of its process
tree from /proc), and beside it, not in the hub's total, the engines', the load generator's (this process:
the agents, reviewers and sockets) and the MCP server's; what the engines did per completed call (Redis
commands, PostgreSQL transactions, the Redis commands run most); the machine's load average; and the
engines' floor measured in the same run by the project's own code (a PostgreSQL commit, a Redis round
trip, a channel-layer send -> receive).

    make bench                                    (closed loop, 30 s)
    make bench BENCH="load --rate 20 --duration 30"
    make bench BENCH="load --web http://127.0.0.1:8000 --web http://127.0.0.1:8002"
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2  # not httpx 0.x: its httpcore tries to import sniffio (absent) on every async request
import psycopg
import websockets
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from approvals.models import Membership, Round, Team
from approvals.services import tokens
from bench import floor, targets
from bench.procs import Proc, answers, cpu_seconds, free_port, hub_env, stat_fields
from bench.stats import pct
from elicit_hub import engines
from elicit_hub.launch import Layout, commands

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "var" / "bench"
KINDS = ("web", "api", "gateway", "holder", "worker")
FINAL = {"completed", "failed", "cancelled", "expired", "outcome_unknown"}
# Measured beside the hub, not counted in its total: the engines, and the benchmark's own agents, reviewers,
# sockets and MCP server, which share the machine's cores with it.
LOAD_GENERATOR = "load generator"
NOT_THE_HUB = frozenset({"engines", LOAD_GENERATOR, "MCP server"})
# How a hub process is told apart when discovered (--web without --pid): a marker in its command line, the
# first kind that matches ("elicit_hub.serve_api" before "elicit_hub.serve").
MARKERS = {
    "api": ("elicit_hub.serve_api",),
    "web": ("elicit_hub.serve", "daphne", "elicit_hub.asgi"),
    "gateway": ("run_gateway",),
    "holder": ("run_holder",),
    "worker": ("celery",),
}


# The latencies the targets judge, as printed.
TO_INBOX = "input_required received -> visible in inbox"
TO_SOCKET = "input_required received -> card on socket"
TO_RETRY = "answer POST -> retry received by the MCP server"


def describe(values: list[float]) -> str:
    if not values:
        return "no samples"
    return (
        f"p50={statistics.median(values):.1f} ms p99={pct(values, 0.99):.1f} ms "
        f"max={max(values):.1f} ms n={len(values)}"
    )


# --- processes and their CPU time ---------------------------------------------------------------------------


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def tree(roots: Iterable[int]) -> set[int]:
    """`roots` and all their descendants alive now."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        fields = stat_fields(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def engine_pids() -> set[int]:
    """The embedded engines' server processes (PostgreSQL's postmaster, Redis), found by their data paths."""
    found = set()
    var = str((ROOT / "var").resolve())  # as the engines were started with it, were var a link
    for pid in all_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        program = cmdline.split(" ", 1)[0].rsplit("/", 1)[-1]
        if var in cmdline and program in ("postgres", "redis-server"):
            found.add(pid)
    return found


def discover() -> dict[str, set[int]]:
    """Hub processes started from this checkout (their working directory), by kind, from command lines."""
    found: dict[str, set[int]] = {kind: set() for kind in KINDS}
    for pid in all_pids():
        try:
            if Path(f"/proc/{pid}/cwd").resolve() != ROOT:
                continue
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "bench" in cmdline.split(" ")[1:3] or "load_server" in cmdline or "honcho" in cmdline:
            continue
        for kind, markers in MARKERS.items():
            if any(marker in cmdline for marker in markers):
                found[kind].add(pid)
                break
    return found


@dataclass(frozen=True)
class EngineCounts:
    """What the engines have done so far: Redis commands (``INFO commandstats``: exact, the commands run
    inside Lua scripts and transactions counted one by one) and PostgreSQL transactions in the hub's database
    (``pg_stat_database``: each backend reports its own within seconds, so over a run of tens of seconds the
    difference is close, not exact). Read with the hub's own Redis client and a plain PostgreSQL connection
    (not Django's, which refuses to run on an event loop), so it may be read on one."""

    redis_by_command: dict[str, int]
    pg_transactions: int

    @property
    def redis_commands(self) -> int:
        return sum(self.redis_by_command.values())

    @classmethod
    def read(cls) -> EngineCounts:
        stats = cache._cache.get_client(write=True).info("commandstats")  # type: ignore[attr-defined]
        with psycopg.connect(settings.DATABASE_URL, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        by_command = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
        return cls(by_command, int(row[0]) if row else 0)

    def __sub__(self, other: EngineCounts) -> EngineCounts:
        names = self.redis_by_command.keys() | other.redis_by_command.keys()
        by_command = {
            name: self.redis_by_command.get(name, 0) - other.redis_by_command.get(name, 0) for name in names
        }
        return EngineCounts(
            {name: n for name, n in by_command.items() if n}, self.pg_transactions - other.pg_transactions
        )

    def top_redis(self, calls: int, n: int = 30) -> str:
        """The Redis commands run most, per completed call (``evalsha`` counts the script's call; the
        commands inside it count under their own names)."""
        top = sorted(self.redis_by_command.items(), key=lambda item: -item[1])[:n]
        return ", ".join(f"{name} {count / calls:.1f}" for name, count in top)


@dataclass
class CpuSample:
    roots: dict[str, set[int]]
    # Kinds measured as their root processes alone, without their descendants: the load generator is the
    # parent of the hub processes it starts.
    alone: frozenset[str] = frozenset({LOAD_GENERATOR})
    start: dict[int, float] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)
    started_at: float = 0.0
    counts_at_start: EngineCounts | None = None

    def begin(self) -> None:
        self.started_at = time.monotonic()
        for kind, roots in self.roots.items():
            for pid in self._pids(kind, roots):
                self.kinds[pid] = kind
                self.start[pid] = cpu_seconds(pid)
        self.counts_at_start = EngineCounts.read()

    def end(self) -> tuple[dict[str, float], float, EngineCounts | None]:
        """CPU seconds of each kind since `begin` (a process born since counts from 0), the wall time, and
        what the engines did meanwhile (None if the sample never began)."""
        used = dict.fromkeys(self.roots, 0.0)
        for kind, roots in self.roots.items():
            for pid in self._pids(kind, roots) | {p for p, k in self.kinds.items() if k == kind}:
                used[kind] += max(0.0, cpu_seconds(pid) - self.start.get(pid, 0.0))
        counts = None if self.counts_at_start is None else EngineCounts.read() - self.counts_at_start
        return used, time.monotonic() - self.started_at, counts

    def _pids(self, kind: str, roots: set[int]) -> set[int]:
        return set(roots) if kind in self.alone else tree(roots)


def _logged(proc: Proc, text: str) -> bool:
    return text in proc.log()


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports."""
    for _ in range(100):
        first = free_port()
        if first + count < 65536 and all(_bindable(first + i) for i in range(1, count)):
            return first
    raise CommandError(f"no {count} consecutive free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def hub_commands(layout: Layout, stamp: int) -> dict[str, list[str]]:
    """What `make run` starts (elicit_hub.launch) for `layout`, but the demo; each worker with its own beat
    schedule file and node name and each holder with its own name, beside any `make run` on this checkout."""
    entries = commands(layout)
    for name, command in entries.items():
        if name.startswith("worker"):
            entries[name] = [
                f"--schedule={LOGS / 'celerybeat-schedule'}"
                if a.startswith("--schedule")
                else f"bench-load-{stamp}-{name}@%h"
                if a.endswith("@%h")
                else a
                for a in command
            ]
        elif name.startswith("holder"):
            entries[name] = [*command, "--name", f"bench-load-{stamp}-{name}"]
    return entries


# --- the load -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hub:
    """Where the load goes: sockets to the web processes (Daphne), API requests to the API servers."""

    webs: list[str]
    apis: list[str]


@dataclass
class Record:
    branch: str
    agent: int
    counted: bool
    submitted: float = 0.0
    call: str = ""
    finished: float = 0.0
    status: str = ""


@dataclass
class Run:
    server: str
    counted: bool = False
    stop: bool = False
    records: list[Record] = field(default_factory=list)
    by_call: dict[str, Record] = field(default_factory=dict)
    inbox_seen: dict[str, float] = field(default_factory=dict)
    socket_seen: dict[str, float] = field(default_factory=dict)
    answer_posted: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # Requests and frames the clients made or got after the warm-up, by kind: the hub's work per call.
    requests: Counter[str] = field(default_factory=Counter)

    def error(self, message: str) -> None:
        self.errors.append(message)

    def count(self, kind: str) -> None:
        if self.counted:
            self.requests[kind] += 1


class Command(BaseCommand):
    help = __doc__
    outcome: dict[str, Any]
    verdicts: list[str]
    throughput = 0.0
    cpu_per_call = 0.0

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--web", action="append", default=[], help="a running hub (repeat for more)")
        parser.add_argument(
            "--api", action="append", default=[], help="a running hub's API server (with --web; repeatable)"
        )
        parser.add_argument(
            "--pid", action="append", default=[], help="KIND:PID of a hub process to measure (with --web)"
        )
        parser.add_argument("--web-processes", type=int, default=1, help="web processes to start (no --web)")
        parser.add_argument(
            "--api-processes",
            type=int,
            default=1,
            help="API servers to start (no --web); 0: Daphne serves /api/",
        )
        parser.add_argument("--workers", type=int, default=1, help="Celery workers to start (no --web)")
        parser.add_argument("--holders", type=int, default=1, help="holders to start (no --web)")
        parser.add_argument(
            "--worker-concurrency",
            type=int,
            default=Layout.worker_concurrency,
            help="Celery pool size of each worker started (no --web)",
        )
        parser.add_argument("--agents", type=int, default=8)
        parser.add_argument("--reviewers", type=int, default=2)
        parser.add_argument("--rate", type=float, default=0.0, help="offered calls/s (0: closed loop)")
        parser.add_argument("--duration", type=float, default=30.0, help="seconds of counted load")
        parser.add_argument("--calls", type=int, default=0, help="stop after this many counted calls")
        parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load not counted")
        parser.add_argument(
            "--poll",
            type=float,
            default=0.0,
            help="reviewers poll the inbox every this many ms; 0 (default): they long-poll it",
        )
        parser.add_argument("--floor", type=int, default=300, help="samples of each engine floor")
        parser.add_argument(
            "--debug", action="store_true", help="run the hub's processes with DEBUG on (as `make run` does)"
        )

    def handle(self, *args: Any, **o: Any) -> None:
        if settings.USING_EMBEDDED_ENGINES:
            engines.start()  # a no-op when they already run
        call_command("migrate", verbosity=0)
        stamp = int(time.time())
        env = hub_env(
            debug=o["debug"],
            ELICIT_OUTBOUND_ALLOW=os.environ.get("ELICIT_OUTBOUND_ALLOW", "127.0.0.0/8,::1"),
            # Bots poll the inbox every few ms: the per-token API rate would refuse them.
            ELICIT_API_RATE=os.environ.get("ELICIT_API_RATE", "10000000/m"),
        )
        procs: list[Proc] = []
        try:
            mcp_port = free_port()
            server = Proc("server", [sys.executable, "bench/load_server.py", f"--port={mcp_port}"], env)
            procs.append(server)
            mcp_base = f"http://127.0.0.1:{mcp_port}"
            server.wait_for(lambda: answers(mcp_base + "/retries"), "the MCP server")
            if o["web"]:
                webs = [url.rstrip("/") for url in o["web"]]
                apis = [url.rstrip("/") for url in o["api"]]
                roots = self._given_pids(o["pid"])
            else:
                webs, apis, roots = self._start_hub(o, env, stamp, procs)
            if settings.USING_EMBEDDED_ENGINES:
                # PostgreSQL's backends are the postmaster's children: the tree counts them.
                roots["engines"] = engine_pids()
            # Not the hub's, but on the same cores: what is left for the hub shows beside them.
            roots[LOAD_GENERATOR] = {os.getpid()}
            roots["MCP server"] = {server.pid}
            shown = ", ".join(f"{kind} {sorted(pids)}" for kind, pids in roots.items())
            api = f"; API: {', '.join(apis)}" if apis else ""
            self.stdout.write(f"hub: {', '.join(webs)}{api}; processes measured: {shown}")
            self._measure(o, stamp, Hub(webs, apis or webs), mcp_base, roots)
        finally:
            for proc in reversed(procs):
                proc.stop()

    def _given_pids(self, given: list[str]) -> dict[str, set[int]]:
        if not given:
            return discover()
        roots: dict[str, set[int]] = {}
        for item in given:
            kind, _, pid = item.partition(":")
            if not pid.isdigit():
                raise CommandError(f"--pid {item!r}: expected KIND:PID, e.g. web:1234")
            roots.setdefault(kind, set()).add(int(pid))
        return roots

    def _start_hub(
        self, o: dict[str, Any], env: dict[str, str], stamp: int, procs: list[Proc]
    ) -> tuple[list[str], list[str], dict[str, set[int]]]:
        base = free_ports(o["web_processes"] + 1 + o["api_processes"])
        layout = Layout(
            web=o["web_processes"],
            api=o["api_processes"],
            workers=o["workers"],
            holders=o["holders"],
            worker_concurrency=o["worker_concurrency"],
            port=base,
            demo_port=None,
        )
        started: dict[str, Proc] = {}
        for name, command in hub_commands(layout, stamp).items():
            started[name] = Proc(name, command, env)
            procs.append(started[name])
        hubs, apis = layout.web_urls, layout.api_urls
        for name, proc in started.items():
            if name.startswith("worker"):
                proc.wait_for(functools.partial(_logged, proc, "ready."), f"the Celery worker {name}")
        servers = [n for n in started if n.startswith("web")] + [n for n in started if n.startswith("api")]
        for url, name in zip([*hubs, *apis], servers, strict=True):
            started[name].wait_for(functools.partial(answers, url + "/accounts/login/"), f"the server {name}")
        gateway = f"http://127.0.0.1:{layout.gateway_ports[0]}/"
        started["gateway"].wait_for(lambda: answers(gateway), "the gateway")
        roots: dict[str, set[int]] = {}
        for name, proc in started.items():
            roots.setdefault(name.rstrip("0123456789"), set()).add(proc.proc.pid)
        return hubs, apis, roots

    # --- set-up ---------------------------------------------------------------------------------------------

    def _setup(
        self, o: dict[str, Any], stamp: int, mcp_base: str
    ) -> tuple[str, list[str], list[tuple[str, str]]]:
        team = Team.objects.create(slug=f"bench-load-{stamp}", name=f"Bench load {stamp}")
        slug = f"bench-load-{stamp}"
        call_command(
            "add_server", slug, mcp_base + "/mcp", "--team", team.slug, "--era", "2026-07-28", verbosity=0
        )
        from approvals.models import McpServer

        server = McpServer.objects.get(slug=slug)
        if not server.tools:
            raise CommandError(
                f"the bench MCP server at {mcp_base} listed no tools (see var/bench/load-server.log)"
            )
        agent_tokens = [
            tokens.agent_create(name=f"bench-load-{stamp}-{i}", servers=[server])[1]
            for i in range(o["agents"])
        ]
        reviewers = []
        for i in range(o["reviewers"]):
            user = get_user_model().objects.create_user(f"bench-load-{stamp}-r{i}")
            Membership.objects.create(team=team, user=user, role=Membership.Role.REVIEWER)
            _, token = tokens.personal_token_create(user=user, name="bench")
            session = SessionStore()
            session[SESSION_KEY] = str(user.pk)
            session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
            session[HASH_SESSION_KEY] = user.get_session_auth_hash()
            session.create()
            assert session.session_key is not None  # create() just saved it
            reviewers.append((token, session.session_key))
        return slug, agent_tokens, reviewers

    # --- the run --------------------------------------------------------------------------------------------

    def _measure(
        self, o: dict[str, Any], stamp: int, hub: Hub, mcp_base: str, roots: dict[str, set[int]]
    ) -> None:
        slug, agent_tokens, reviewers = self._setup(o, stamp, mcp_base)
        load_before = os.getloadavg()
        cpu = CpuSample(roots)
        run = Run(server=slug)
        wall = asyncio.run(self._drive(o, stamp, hub, agent_tokens, reviewers, run, cpu))
        used, cpu_wall, engine_counts = cpu.end()
        load_after = os.getloadavg()
        retries = httpx2.get(mcp_base + "/retries", timeout=10).json()
        figures = self._report(o, run, wall, used, cpu_wall, retries, load_before, load_after, engine_counts)
        hops = self._floor(o["floor"])
        self.verdicts = targets.judge(
            targets.Figures(
                rate=o["rate"],
                throughput=self.throughput,
                errors=len(run.errors),
                cpu_per_call=self.cpu_per_call,
                to_inbox=figures[TO_INBOX],
                to_socket=figures[TO_SOCKET],
                to_retry=figures[TO_RETRY],
                floor_hops=hops,
            )
        )
        for line in self.verdicts:
            self.stdout.write(f"target: {line}")
        # For a caller in the same process (bench/scale.py): what ran, to compare and to check.
        self.outcome = {
            "server": slug,
            "calls": [r.call for r in run.records if r.call],
            "submits_failed": sum(1 for r in run.records if not r.call),
            "errors": list(run.errors),
            "throughput": self.throughput,
            "cpu_ms_per_call": self.cpu_per_call,
        }

    async def _drive(
        self,
        o: dict[str, Any],
        stamp: int,
        hub: Hub,
        agent_tokens: list[str],
        reviewers: list[tuple[str, str]],
        run: Run,
        cpu: CpuSample,
    ) -> float:
        limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=1000)
        agents = [
            httpx2.AsyncClient(
                base_url=hub.apis[i % len(hub.apis)],
                headers={"Authorization": f"Bearer {t}"},
                timeout=90,
                limits=limits,
            )
            for i, t in enumerate(agent_tokens)
        ]
        bots = [
            httpx2.AsyncClient(
                base_url=hub.apis[i % len(hub.apis)], headers={"Authorization": f"Bearer {t}"}, timeout=30
            )
            for i, (t, _) in enumerate(reviewers)
        ]
        done = asyncio.Event()
        ready = [asyncio.Event() for _ in reviewers]
        sockets = [
            asyncio.create_task(self._socket(hub.webs[i % len(hub.webs)], cookie, run, ready[i], done))
            for i, (_, cookie) in enumerate(reviewers)
        ]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 30)
        bot_tasks = [
            asyncio.create_task(self._bot(k, len(bots), bot, run, o["poll"] / 1000, done))
            for k, bot in enumerate(bots)
        ]
        counter = iter(range(10**9))
        inflight: set[asyncio.Task[None]] = set()

        async def one(agent: int) -> None:
            record = Record(branch=f"load-{stamp}-{next(counter)}", agent=agent, counted=run.counted)
            run.records.append(record)
            await self._call(agents[agent], record, run)

        started = time.monotonic()
        warm_until = started + o["warmup"]
        end_at = warm_until + o["duration"]

        def more() -> bool:
            now = time.monotonic()
            if not run.counted and now >= warm_until:
                run.counted = True
                cpu.begin()
            if o["calls"] and sum(r.counted for r in run.records) >= o["calls"]:
                return False
            return now < end_at

        if o["rate"] > 0:
            interval = 1 / o["rate"]
            n = 0
            while more():
                task = asyncio.create_task(one(n % len(agents)))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                n += 1
                delay = started + n * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        else:

            async def loop(agent: int) -> None:
                while more():
                    await one(agent)

            await asyncio.gather(*(loop(i) for i in range(len(agents))))
        if inflight:
            await asyncio.wait(inflight, timeout=120)
        wall = time.monotonic() - warm_until
        done.set()
        for task in bot_tasks:  # a long-polling bot would otherwise wait out its poll
            task.cancel()
        await asyncio.gather(*bot_tasks, return_exceptions=True)
        for task in sockets:
            task.cancel()
        await asyncio.gather(*sockets, return_exceptions=True)
        for client in (*agents, *bots):
            await client.aclose()
        return wall

    async def _call(self, client: httpx2.AsyncClient, record: Record, run: Run) -> None:
        record.submitted = time.time()
        run.count("submit")
        try:
            response = await client.post(
                "/api/v1/calls",
                json={
                    "server": run.server,
                    "tool": "create_deployment",
                    "arguments": {"branch": record.branch},
                },
            )
            if response.status_code not in (200, 201, 202):
                run.error(f"submit: {response.status_code} {response.text[:200]}")
                return
            record.call = response.json()["id"]
            run.by_call[record.call] = record
            while True:
                run.count("call long-poll")
                polled = await client.get(f"/api/v1/calls/{record.call}", params={"wait": 60})
                if polled.status_code != 200:
                    run.error(f"long-poll: {polled.status_code} {polled.text[:200]}")
                    return
                status = polled.json()["status"]
                if status in FINAL:
                    record.finished, record.status = time.time(), status
                    if status != "completed":
                        run.error(f"call {record.call} ended {status}")
                    return
        except httpx2.HTTPError as exc:
            run.error(f"{type(exc).__name__}: {exc}")

    async def _bot(
        self, k: int, n: int, client: httpx2.AsyncClient, run: Run, poll: float, done: asyncio.Event
    ) -> None:
        """A reviewer bot: polls the inbox (every `poll` s; long-polls it when 0), notes when each call's
        request first showed, answers its share."""
        answered: set[str] = set()
        version = ""

        async def answer(item: dict[str, Any]) -> None:
            run.answer_posted.setdefault(item["call"], time.time())
            run.count("answer")
            response = await client.post(
                f"/api/v1/input-requests/{item['id']}/respond",
                json={"action": "accept", "content": {"environment": "staging"}},
            )
            if response.status_code != 200:
                run.error(f"respond: {response.status_code} {response.text[:200]}")

        while not done.is_set():
            try:
                params: dict[str, Any] = {"limit": 500}
                if not poll and version:
                    params.update(version=version, wait=30)
                run.count("inbox read")
                response = await client.get("/api/v1/inbox", params=params)
                now = time.time()
                version = response.headers.get("Inbox-Version", "")
                if response.status_code != 200:
                    run.error(f"inbox: {response.status_code} {response.text[:200]}")
                    await asyncio.sleep(1)
                    continue
                mine = []
                for item in response.json():
                    if item["server"] != run.server:
                        continue
                    run.inbox_seen.setdefault(item["call"], now)
                    if item["id"] not in answered and int(item["id"].replace("-", ""), 16) % n == k:
                        answered.add(item["id"])
                        mine.append(item)
                if mine:
                    await asyncio.gather(*(answer(item) for item in mine))
            except httpx2.HTTPError as exc:
                run.error(f"bot: {type(exc).__name__}: {exc}")
            if poll:
                await asyncio.sleep(poll)

    async def _socket(
        self, web: str, cookie: str, run: Run, ready: asyncio.Event, done: asyncio.Event
    ) -> None:
        headers = {"Cookie": f"sessionid={cookie}", "Origin": web}
        url = web.replace("http", "ws", 1) + "/ws/queue/"
        async with websockets.connect(url, additional_headers=headers, max_size=2**22) as ws:
            ready.set()
            async for raw in ws:
                now = time.time()
                message = json.loads(raw)
                run.count(f"socket {message.get('type')} frame")
                if message.get("type") == "card" and message.get("event") == "round.opened":
                    run.socket_seen.setdefault(str(message.get("call")), now)

    # --- the report -----------------------------------------------------------------------------------------

    def _report(
        self,
        o: dict[str, Any],
        run: Run,
        wall: float,
        used: dict[str, float],
        cpu_wall: float,
        retries: dict[str, float],
        load_before: tuple[float, float, float],
        load_after: tuple[float, float, float],
        engine_counts: EngineCounts | None,
    ) -> dict[str, list[float]]:
        """Prints the run's figures; answers its latency samples (ms) by the label printed."""
        counted = [r for r in run.records if r.counted]
        ids = {r.call: r for r in counted if r.call}
        completed = [r for r in counted if r.status == "completed"]
        opened = {
            str(call_id): at.timestamp()
            for call_id, at in Round.objects.filter(call_id__in=list(ids), number=1).values_list(
                "call_id", "opened_at"
            )
        }
        first = min((r.submitted for r in counted), default=0.0)
        last = max((r.finished for r in completed), default=first)
        span = max(last - first, 1e-9)
        mode = f"offered {o['rate']:g} calls/s" if o["rate"] > 0 else "closed loop"
        inbox = f"inbox polled every {o['poll']:g} ms" if o["poll"] else "inbox long-polled"
        self.stdout.write(
            f"load: {mode}, {o['agents']} agents, {o['reviewers']} reviewers ({inbox}), "
            f"{o['duration']:g} s counted after {o['warmup']:g} s warm-up"
        )
        self.stdout.write(
            f"calls: {len(counted)} counted, {len(completed)} completed; "
            f"throughput {len(completed) / span:.1f} calls/s over {span:.1f} s; errors {len(run.errors)}"
        )
        for message in run.errors[:5]:
            self.stdout.write(f"  error: {message}")

        def samples(ends: dict[str, float], starts: dict[str, float]) -> list[float]:
            return [(ends[c] - starts[c]) * 1000 for c in ids if c in ends and c in starts]

        submitted = {c: r.submitted for c, r in ids.items()}
        finished = {c: r.finished for c, r in ids.items() if r.finished}
        retry_at = {c: retries[r.branch] for c, r in ids.items() if r.branch in retries}
        rows = (
            ("submit -> visible in inbox", samples(run.inbox_seen, submitted)),
            (TO_INBOX, samples(run.inbox_seen, opened)),
            (TO_SOCKET, samples(run.socket_seen, opened)),
            (TO_RETRY, samples(retry_at, run.answer_posted)),
            ("answer POST -> agent sees the call completed", samples(finished, run.answer_posted)),
            ("submit -> agent sees the call completed", samples(finished, submitted)),
        )
        for label, values in rows:
            self.stdout.write(f"{label}: {describe(values)}")
        total = 0.0
        parts = []
        for kind, seconds in used.items():
            per_call = 1000 * seconds / max(len(completed), 1)
            total += per_call if kind not in NOT_THE_HUB else 0.0
            parts.append(f"{kind} {per_call:.1f} ms ({100 * seconds / cpu_wall:.0f} % of a core)")
        self.stdout.write(f"CPU per completed call: {'; '.join(parts)}; hub total {total:.1f} ms")
        counts = ", ".join(
            f"{kind} {n / max(len(completed), 1):.2f}" for kind, n in sorted(run.requests.items())
        )
        self.stdout.write(f"per completed call (both bots and sockets together): {counts}")
        if engine_counts is not None:
            calls = max(len(completed), 1)
            self.stdout.write(
                f"engines per completed call: Redis {engine_counts.redis_commands / calls:.1f} commands, "
                f"PostgreSQL about {engine_counts.pg_transactions / calls:.1f} transactions (a statement "
                "outside one counts as one); background work (beat, heartbeats, idle polls) included"
            )
            top = engine_counts.top_redis(calls)
            self.stdout.write(f"Redis commands per completed call, most run: {top}")
        self.throughput, self.cpu_per_call = len(completed) / span, total
        self.stdout.write(
            "load average (1/5/15 min): before "
            + " ".join(f"{x:.2f}" for x in load_before)
            + ", after "
            + " ".join(f"{x:.2f}" for x in load_after)
            + f", {os.cpu_count()} cores"
        )
        return dict(rows)

    def _floor(self, n: int) -> list[float]:
        """The engines' floor with the project's own code: one hop, a commit plus a Redis publish reaching a
        subscriber, paired (``bench.floor``, as ``shared/tools/floor.py`` measures it); beside it, a cache
        round trip and a channel-layer send -> receive. Answers the hops (ms)."""
        measured = floor.measure(n)
        redis_trips: list[float] = []
        cache.get("bench-floor")
        for _ in range(n):
            t0 = time.perf_counter()
            cache.get("bench-floor")
            redis_trips.append((time.perf_counter() - t0) * 1000)
        layer = asyncio.run(self._layer_floor(n))
        self.stdout.write(f"floor: PostgreSQL commit {describe(measured.commits)}")
        self.stdout.write(f"floor: Redis publish -> subscriber {describe(measured.publishes)}")
        self.stdout.write(f"floor: one hop (commit + publish, paired) {describe(measured.hops)}")
        self.stdout.write(f"beside the floor: Redis round trip through the cache {describe(redis_trips)}")
        self.stdout.write(f"beside the floor: channel layer send -> receive {describe(layer)}")
        reference = floor.cpu_reference()
        self.stdout.write(
            f"beside the floor: this machine's speed, {floor.REFERENCE_HASHES:,} audit hashes (CPU time, "
            f"compare CPU per call across runs with it): p50={statistics.median(reference):.1f} ms "
            f"min={min(reference):.1f} ms n={len(reference)}"
        )
        return measured.hops

    async def _layer_floor(self, n: int) -> list[float]:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return []
        channel = await layer.new_channel()
        hops = []
        for i in range(n):
            t0 = time.perf_counter()
            await layer.send(channel, {"type": "bench.floor", "n": i})
            await layer.receive(channel)
            hops.append((time.perf_counter() - t0) * 1000)
        return hops
