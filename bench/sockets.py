"""Benchmark idle reviewer sockets: N authenticated queue websockets on one Daphne process, held idle.

Starts its own Daphne (``python -m elicit_hub.serve``, as ``make run`` does) on the engines the settings
name, unless ``--hub URL --pid PID`` name one already running. Creates ``--sockets`` reviewers of one team
(reused across runs) with real sessions, opens one queue socket each (``/ws/queue/``, same Origin as the
browser), waits for every ``hello``, then holds them idle for ``--idle`` seconds. Idle is what a reviewer's
open tab does: every ``--ping`` seconds (the page's interval, 10) it sends ``{"type": "ping"}``, at a random
phase per socket; ``--ping 0`` sends nothing. Over that window it reads Daphne's CPU time (utime + stime in
/proc/<pid>/stat; % of one core) and memory (VmRSS). Then it opens one round for the team and counts the
sockets its card reaches, which shows the sockets were alive, not just counted.

    make bench BENCH="sockets"                       # 1,000 sockets, a minute idle
    make bench BENCH="sockets --sockets 200 --idle 20 --ping 0"
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import sys
import time
from typing import Any

import websockets
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from approvals.models import McpServer, Membership, Team
from approvals.services import calls, tokens
from bench import targets
from bench.procs import Proc, answers, cpu_seconds, free_port, load_average, memory_kib
from elicit_hub import engines

TEAM = "bench-sockets"
BATCH = 25
FORM = {
    "method": "elicitation/create",
    "params": {
        "message": "Is everyone still there?",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
    },
}


def _raise_open_files(wanted: int) -> None:
    """Each socket is a descriptor on both ends; Daphne inherits this limit from us."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else min(hard, max(soft, wanted))
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        raise CommandError(f"open-file limit below {wanted}: raise `ulimit -n`")


class Command(BaseCommand):
    help = __doc__
    verdicts: list[str]

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--sockets", type=int, default=1000)
        parser.add_argument("--idle", type=float, default=60.0, help="seconds held idle while measured")
        parser.add_argument(
            "--ping", type=float, default=10.0, help="seconds between a socket's pings; 0: none"
        )
        parser.add_argument("--hub", default="", help="a running hub's web process (default: start one)")
        parser.add_argument("--pid", type=int, default=0, help="that web process's pid")

    def handle(self, *args: Any, **o: Any) -> None:
        if o["sockets"] < 1 or o["idle"] <= 0:
            raise CommandError("--sockets and --idle must be positive")
        if bool(o["hub"]) != bool(o["pid"]):
            raise CommandError("--hub and --pid go together")
        _raise_open_files(o["sockets"] * 2 + 256)
        if settings.USING_EMBEDDED_ENGINES:
            engines.start()  # a no-op when `make run` or a test run already started them
        call_command("migrate", verbosity=0)
        team, cookies = self._reviewers(o["sockets"])
        web = None
        hub, pid = o["hub"], o["pid"]
        if not hub:
            port = free_port()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            web = Proc(
                "sockets-web",
                [sys.executable, "-m", "elicit_hub.serve", "-b", "127.0.0.1", "-p", str(port),
                 "elicit_hub.asgi:application"],
                env,
            )  # fmt: skip
            hub, pid = f"http://127.0.0.1:{port}", web.pid
            web.wait_for(lambda: answers(hub + "/accounts/login/"), "the web server")
        try:
            result = asyncio.run(self._measure(hub, pid, team, cookies, o))
        finally:
            if web is not None:
                web.stop()
        for line in result:
            self.stdout.write(line)

    def _reviewers(self, count: int) -> tuple[Team, list[str]]:
        """`count` reviewers of one team, each with a fresh session (users are reused across runs)."""
        team, _ = Team.objects.get_or_create(slug=TEAM, defaults={"name": "Bench sockets"})
        User = get_user_model()
        names = [f"bench-socket-{i}" for i in range(count)]
        existing = set(User.objects.filter(username__in=names).values_list("username", flat=True))
        User.objects.bulk_create(
            [User(username=n, password=make_password(None)) for n in names if n not in existing]
        )
        users = list(User.objects.filter(username__in=names))
        members = set(Membership.objects.filter(team=team).values_list("user_id", flat=True))
        Membership.objects.bulk_create(
            [
                Membership(team=team, user=u, role=Membership.Role.REVIEWER)
                for u in users
                if u.pk not in members
            ]
        )
        cookies = []
        for user in users:
            session = SessionStore()
            session[SESSION_KEY] = str(user.pk)
            session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
            session[HASH_SESSION_KEY] = user.get_session_auth_hash()
            session.create()
            assert session.session_key is not None  # create() just saved it
            cookies.append(session.session_key)
        return team, cookies

    def _open_round(self, team: Team) -> str:
        """A relayed request for the team (no MCP server is called), broadcast as a new round."""
        server, _ = McpServer.objects.get_or_create(
            slug=TEAM,
            defaults={"name": "Bench sockets", "url": "https://bench.invalid/mcp", "default_team": team},
        )
        agent, _ = tokens.agent_create(name=f"bench-sockets-{time.time_ns()}", servers=[server])
        relay, _ = calls.relay_submit(
            agent=agent,
            server_slug=server.slug,
            tool="still_there",
            arguments={},
            input_requests={"ok": FORM},
        )
        return str(relay.pk)

    async def _measure(
        self, hub: str, pid: int, team: Team, cookies: list[str], o: dict[str, Any]
    ) -> list[str]:
        url = hub.replace("http", "ws", 1) + "/ws/queue/"
        interval: float = o["ping"]
        stats = {"pongs": 0, "resyncs": 0, "closed": 0, "refused": 0}
        cards: dict[int, float] = {}
        hello = [asyncio.Event() for _ in cookies]
        idle_over = asyncio.Event()

        async def session(i: int, cookie: str) -> None:
            headers = {"Cookie": f"sessionid={cookie}", "Origin": hub}
            async with websockets.connect(
                url, additional_headers=headers, ping_interval=None, max_size=2**22
            ) as ws:

                async def pinger() -> None:
                    await asyncio.sleep(random.uniform(0, interval))
                    while not idle_over.is_set():
                        await ws.send('{"type": "ping"}')
                        await asyncio.sleep(interval)

                ping_task = asyncio.create_task(pinger()) if interval > 0 else None
                try:
                    async for raw in ws:
                        kind = json.loads(raw).get("type")
                        if kind == "hello":
                            hello[i].set()
                        elif kind == "pong":
                            stats["pongs"] += 1
                        elif kind == "resync":
                            stats["resyncs"] += 1
                        elif kind == "card":
                            cards.setdefault(i, time.monotonic())
                finally:
                    if ping_task is not None:
                        ping_task.cancel()

        async def reviewer(i: int, cookie: str) -> None:
            """One tab: it connects again after a refusal or a close, backing off as the page does."""
            for attempt in range(8):
                with contextlib.suppress(OSError, websockets.WebSocketException):
                    await session(i, cookie)
                stats["closed" if hello[i].is_set() else "refused"] += 1
                await asyncio.sleep(min(10.0, 0.5 * 2**attempt))

        t_open = time.monotonic()
        tasks: list[asyncio.Task[None]] = []
        for start in range(0, len(cookies), BATCH):  # connect in batches, as browsers arrive
            batch = [
                asyncio.create_task(reviewer(i, cookies[i]))
                for i in range(start, min(start + BATCH, len(cookies)))
            ]
            tasks += batch
            await asyncio.wait_for(
                asyncio.gather(*(hello[i].wait() for i in range(start, start + len(batch)))), 120
            )
        opened = time.monotonic() - t_open
        await asyncio.sleep(5)  # let the last connects' work finish before the window starts
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        pongs0, resyncs0, closed0 = stats["pongs"], stats["resyncs"], stats["closed"]
        await asyncio.sleep(o["idle"])
        cpu = 100 * (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        pongs, resyncs = stats["pongs"] - pongs0, stats["resyncs"] - resyncs0
        closed = stats["closed"] - closed0
        memory = memory_kib(pid)
        idle_over.set()
        sent = time.monotonic()
        call_id = await asyncio.to_thread(self._open_round, team)
        deadline = time.monotonic() + 120
        while len(cards) < len(cookies) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        first, last = (
            ((min(cards.values()) - sent) * 1000, (max(cards.values()) - sent) * 1000) if cards else (0, 0)
        )
        pinging = f"a ping every {interval:g} s" if interval else "no pings"
        # Kept for a caller in the same process (bench/suite.py) as well as printed.
        self.verdicts = targets.judge_idle_sockets(sockets=len(cookies), cpu_percent=cpu, reached=len(cards))
        return [
            f"sockets={len(cookies)} opened in {opened:.1f} s; idle {o['idle']:.0f} s, {pinging}",
            f"daphne (pid {pid}): cpu {cpu:.1f} % of one core, rss {memory.get('VmRSS', 0) / 1024:.0f} MiB, "
            f"threads {memory.get('Threads', 0)}",
            f"during the window: {pongs} pongs, {resyncs} resyncs, {closed} sockets closed by the server",
            f"connects refused or timed out while opening (then retried): {stats['refused']}",
            f"a new round (call {call_id}) reached {len(cards)} of {len(cookies)} sockets"
            + (f", the first in {first:.0f} ms, the last in {last:.0f} ms" if cards else ""),
            f"load average: {load_average()}",
            *(f"target: {line}" for line in self.verdicts),
        ]
