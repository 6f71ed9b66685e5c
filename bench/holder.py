"""Benchmark the holder: N idle handshake-era sessions in one holder process; push -> reviewer latency.

Starts its own processes on the engines the settings name (the embedded ones under ./var unless
DATABASE_URL / REDIS_URL are set; run with DJANGO_DEBUG=true, as `make run` does): an MCP server whose tool
asks with ``ctx.elicit()`` and waits (bench/holder_server.py), a Celery worker, one holder
(``manage.py run_holder``) and the web server. Do not run it beside ``make run``: that holder would take
some of the calls.

1. Opens ``--sessions`` calls at once; each becomes a session whose server pushed an elicitation and waits.
2. Over a quiet ``--quiet`` seconds, reads the holder's CPU time (utime + stime in /proc/<pid>/stat) and
   memory (VmRSS, VmHWM): CPU is reported as % of one core.
3. Sends ``--calls`` more calls one at a time through the API and records, for each, when the server sent
   ``elicitation/create`` (the server's clock, the same machine) and when the reviewer saw it: the card
   frame on a reviewer's websocket, and the item in ``GET /api/v1/inbox`` (polled every ``--poll`` ms).

    DJANGO_DEBUG=true make bench BENCH="holder --sessions 500"
    DJANGO_DEBUG=true make bench BENCH="holder --sessions 50 --quiet 20 --calls 20"
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

import httpx2
import websockets
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from approvals.models import Holder, McpServer, Membership, Round, Team
from approvals.services import calls, tokens
from bench.procs import Proc, cpu_seconds, free_port, memory_kib
from bench.procs import answers as _answers
from bench.stats import pct
from elicit_hub import engines


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--sessions", type=int, default=500, help="idle sessions to hold")
        parser.add_argument("--quiet", type=float, default=60.0, help="seconds of the quiet CPU sample")
        parser.add_argument("--calls", type=int, default=50, help="calls timed one at a time")
        parser.add_argument("--poll", type=float, default=10.0, help="inbox polling interval, ms")

    def handle(self, *args: Any, **o: Any) -> None:
        if settings.USING_EMBEDDED_ENGINES:
            engines.start()  # a no-op when `make run` or a test run already started them
        call_command("migrate", verbosity=0)
        fresh = timezone.now() - timedelta(seconds=getattr(settings, "ELICIT_HOLDER_STALE", 30))
        if Holder.objects.filter(heartbeat_at__gte=fresh).exists():
            raise CommandError("a holder is running (is `make run` up?): stop it, it would take calls")
        stamp = int(time.time())
        env = {
            **os.environ,
            "DJANGO_DEBUG": "true",
            "PYTHONUNBUFFERED": "1",
            "ELICIT_OUTBOUND_ALLOW": os.environ.get("ELICIT_OUTBOUND_ALLOW", "127.0.0.0/8,::1"),
            "ELICIT_HOLDER_MAX_CALLS": str(o["sessions"] + o["calls"] + 10),
            # The reviewer polls the inbox every few ms: the per-token API rate would refuse it.
            "ELICIT_API_RATE": "1000000/m",
        }
        mcp_port, web_port = free_port(), free_port()
        py = sys.executable
        procs: list[Proc] = []
        try:
            server = Proc("server", [py, "bench/holder_server.py", f"--port={mcp_port}"], env)
            procs.append(server)
            server.wait_for(lambda: _answers(f"http://127.0.0.1:{mcp_port}/sent"), "the MCP server")
            worker = Proc(
                "worker",
                [py, "-m", "celery", "-A", "elicit_hub", "worker", "--pool=solo", "--without-gossip",
                 "--without-mingle", "--without-heartbeat", "--loglevel=INFO", "-n", f"bench-{stamp}@%h"],
                env,
            )  # fmt: skip
            procs.append(worker)
            holder = Proc("holder", [py, "manage.py", "run_holder", "--name", f"bench-{stamp}"], env)
            procs.append(holder)
            web = Proc(
                "web",
                [py, "-m", "elicit_hub.serve", "-b", "127.0.0.1", "-p", str(web_port),
                 "elicit_hub.asgi:application"],
                env,
            )  # fmt: skip
            procs.append(web)
            worker.wait_for(lambda: "ready." in worker.log(), "the Celery worker")
            holder.wait_for(lambda: Holder.objects.filter(name=f"bench-{stamp}").exists(), "the holder")
            hub = f"http://127.0.0.1:{web_port}"
            web.wait_for(lambda: _answers(hub + "/accounts/login/"), "the web server")
            self._run(o, stamp, hub, f"http://127.0.0.1:{mcp_port}", holder.proc.pid)
        finally:
            for proc in reversed(procs):
                proc.stop()

    def _run(self, o: dict[str, Any], stamp: int, hub: str, mcp_base: str, holder_pid: int) -> None:
        # The idle sessions wait for another team, so the timed reviewer's inbox (oldest first, capped) and
        # websocket show only the timed calls; both servers are the same process.
        idle_team = Team.objects.create(slug=f"bench-idle-{stamp}", name=f"Bench idle {stamp}")
        team = Team.objects.create(slug=f"bench-holder-{stamp}", name=f"Bench holder {stamp}")
        user = get_user_model().objects.create_user(f"bench-holder-{stamp}")
        Membership.objects.create(team=team, user=user, role=Membership.Role.REVIEWER)
        common = {"url": mcp_base + "/mcp", "era": McpServer.Era.HANDSHAKE, "elicitation_wait": 3600}
        idle = McpServer.objects.create(
            slug=f"bench-idle-{stamp}", name="Bench idle", default_team=idle_team, **common
        )
        server = McpServer.objects.create(
            slug=f"bench-holder-{stamp}", name="Bench holder", default_team=team, **common
        )
        agent, agent_token = tokens.agent_create(name=f"bench-holder-{stamp}", servers=[idle, server])
        _, reviewer_token = tokens.personal_token_create(user=user)
        cookie = self._cookie(user)

        # 0. The holder's own floor, holding nothing (heartbeat, polling).
        floor = min(o["quiet"], 20.0)
        cpu0, t0 = cpu_seconds(holder_pid), time.monotonic()
        time.sleep(floor)
        cpu = 100 * (cpu_seconds(holder_pid) - cpu0) / (time.monotonic() - t0)
        rss = memory_kib(holder_pid).get("VmRSS", 0) / 1024
        self.stdout.write(
            f"holder with no sessions over {floor:.0f} s: CPU {cpu:.2f} % of a core; RSS {rss:.1f} MiB"
        )

        # 1. N idle sessions, each waiting on a pushed elicitation.
        started = time.monotonic()
        ids = [
            str(calls.call_submit(agent=agent, server_slug=idle.slug, tool="wait_for_person",
                                  arguments={"n": i})[0].pk)
            for i in range(o["sessions"])
        ]  # fmt: skip
        deadline = time.monotonic() + max(120, o["sessions"] * 0.5)
        held = 0
        while time.monotonic() < deadline:
            held = Round.objects.filter(call_id__in=ids, kind=Round.Kind.PUSH).count()
            if held >= len(ids):
                break
            time.sleep(0.5)
        opened_in = time.monotonic() - started
        self.stdout.write(f"sessions={o['sessions']} push rounds open={held} after {opened_in:.1f} s")
        if held < len(ids):
            self.stdout.write(
                "not every session reached its elicitation; figures below are for those that did"
            )

        # 2. A quiet minute: the holder's CPU and memory while it only holds.
        time.sleep(3)
        cpu0, t0 = cpu_seconds(holder_pid), time.monotonic()
        time.sleep(o["quiet"])
        cpu1, t1 = cpu_seconds(holder_pid), time.monotonic()
        mem = memory_kib(holder_pid)
        cpu = 100 * (cpu1 - cpu0) / (t1 - t0)
        rss, peak = mem.get("VmRSS", 0) / 1024, mem.get("VmHWM", 0) / 1024
        self.stdout.write(
            f"holder idle with {held} sessions over {t1 - t0:.0f} s: CPU {cpu:.2f} % of a core; "
            f"RSS {rss:.1f} MiB (peak {peak:.1f} MiB), threads {mem.get('Threads', 0)}"
        )

        # 3. Latency from the server's elicitation/create to the reviewer's screen, with N sessions held.
        ws_at, inbox_at, timed, submitted = asyncio.run(
            self._latency(hub, agent_token, reviewer_token, cookie, server.slug, o, base=o["sessions"])
        )
        sent = httpx2.get(mcp_base + "/sent", timeout=10).json()
        numbers = {call_id: n for n, call_id in timed.items()}
        rounds = Round.objects.filter(call_id__in=list(timed.values())).values_list("call_id", "opened_at")
        opened = {str(call_id): at for call_id, at in rounds}
        ws_ms = [(ws_at[c] - sent[str(numbers[c])]) * 1000 for c in ws_at if str(numbers[c]) in sent]
        inbox_ms = [(inbox_at[c] - sent[str(numbers[c])]) * 1000 for c in inbox_at if str(numbers[c]) in sent]
        pickup_ms = [
            (sent[str(numbers[c])] - submitted[c]) * 1000 for c in submitted if str(numbers[c]) in sent
        ]
        stored_ms = [
            (opened[c].timestamp() - sent[str(numbers[c])]) * 1000
            for c in opened
            if c in numbers and str(numbers[c]) in sent
        ]
        self.stdout.write(f"timed calls={len(timed)} (with {held} sessions held)")
        for label, samples in (
            ("API accepted the call -> server sent elicitation/create", pickup_ms),
            ("elicitation/create -> round stored", stored_ms),
            ("elicitation/create -> websocket card", ws_ms),
            (f"elicitation/create -> inbox API (poll {o['poll']:g} ms)", inbox_ms),
        ):
            if samples:
                self.stdout.write(
                    f"{label}: p50={statistics.median(samples):.1f} ms p99={pct(samples, 0.99):.1f} ms "
                    f"max={max(samples):.1f} ms (n={len(samples)})"
                )
            else:
                self.stdout.write(f"{label}: no samples")

    def _cookie(self, user: Any) -> str:
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        assert session.session_key is not None
        return session.session_key

    async def _latency(
        self,
        hub: str,
        agent_token: str,
        reviewer_token: str,
        cookie: str,
        slug: str,
        o: dict[str, Any],
        base: int,
    ) -> tuple[dict[str, float], dict[str, float], dict[int, str], dict[str, float]]:
        submitted: dict[str, float] = {}
        ws_at: dict[str, float] = {}
        inbox_at: dict[str, float] = {}
        timed: dict[int, str] = {}
        ready = asyncio.Event()

        async def listen() -> None:
            headers = {"Cookie": f"sessionid={cookie}", "Origin": hub}
            url = hub.replace("http", "ws", 1) + "/ws/queue/"
            async with websockets.connect(url, additional_headers=headers, max_size=2**22) as ws:
                ready.set()
                async for raw in ws:
                    now = time.time()
                    message = json.loads(raw)
                    if message.get("type") == "card" and message.get("event") == "round.opened":
                        ws_at.setdefault(str(message["call"]), now)

        listener = asyncio.create_task(listen())
        await asyncio.wait_for(ready.wait(), 30)
        agent_headers = {"Authorization": f"Bearer {agent_token}"}
        reviewer_headers = {"Authorization": f"Bearer {reviewer_token}"}
        async with (
            httpx2.AsyncClient(base_url=hub, headers=agent_headers, timeout=30) as agent,
            httpx2.AsyncClient(base_url=hub, headers=reviewer_headers, timeout=30) as reviewer,
        ):
            for i in range(o["calls"]):
                n = base + i
                before = time.time()
                response = await agent.post(
                    "/api/v1/calls", json={"server": slug, "tool": "wait_for_person", "arguments": {"n": n}}
                )
                if response.status_code != 202:
                    raise CommandError(f"submitting a call failed: {response.status_code} {response.text}")
                call_id = response.json()["id"]
                timed[n] = call_id
                submitted[call_id] = before
                deadline = time.monotonic() + 60
                while call_id not in inbox_at and time.monotonic() < deadline:
                    page = await reviewer.get("/api/v1/inbox", params={"limit": 1000})
                    if page.status_code != 200:
                        raise CommandError(f"the inbox answered {page.status_code}: {page.text[:300]}")
                    if any(item.get("call") == call_id for item in page.json()):
                        inbox_at[call_id] = time.time()
                        break
                    await asyncio.sleep(o["poll"] / 1000)
                deadline = min(deadline, time.monotonic() + 5)
                while call_id not in ws_at and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
        listener.cancel()
        return ws_at, inbox_at, timed, submitted
