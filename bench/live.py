"""Benchmark live delivery against a running hub (`make run`): input_required received -> frame on a socket.

Opens N reviewer websockets (real sessions, same Origin as the browser), parks P pending requests in the
queue, then submits calls one at a time and records, for every socket, when the card frame for each new
round arrives. Latency = frame arrival - Round.opened_at (the moment the worker had the server's
input_required in hand), both on this machine's clock. The engines' floor (a PostgreSQL commit plus a Redis
publish reaching a subscriber, bench/floor.py) is measured in the same run (``--floor N`` samples, 0 for
none), and the ratio hub / floor printed: unloaded, the target is at most 10x.

    make bench BENCH="live --sockets 50 --pending 500 --calls 40"
    make bench BENCH="live --sockets 1 --pending 0 --calls 40"
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import httpx2
import websockets
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.management.base import BaseCommand, CommandError

from approvals.models import McpServer, Membership, Round, Team
from approvals.services import calls, tokens
from bench import floor, targets
from bench.procs import load_average
from bench.stats import pct

ENV_FORM = {
    "method": "elicitation/create",
    "params": {
        "message": "Parked for the benchmark",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
    },
}


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--hub", default="http://127.0.0.1:8000")
        parser.add_argument("--server", default="demo")
        parser.add_argument("--sockets", type=int, default=50)
        parser.add_argument("--pending", type=int, default=500)
        parser.add_argument("--calls", type=int, default=40)
        parser.add_argument("--floor", type=int, default=500, help="samples of the engines' floor (0: none)")

    def handle(self, *args: Any, **o: Any) -> None:
        server = McpServer.objects.filter(slug=o["server"]).first()
        if server is None or server.default_team is None:
            raise CommandError("start `make run` first (it registers the demo server for team release)")
        stamp = int(time.time())
        agent, token = tokens.agent_create(name=f"bench-live-{stamp}", servers=[server])
        cookies = self._sessions(server.default_team, o["sockets"], stamp)
        self._park(agent, o["pending"])
        ids, arrivals = asyncio.run(self._measure(o["hub"], token, o["server"], cookies, o["calls"]))
        rounds = Round.objects.filter(call_id__in=ids, number=1).values_list("call_id", "opened_at")
        opened = {str(call_id): at.timestamp() for call_id, at in rounds}
        samples = [(t - opened[c]) * 1000 for c, times in arrivals.items() if c in opened for t in times]
        self.stdout.write(
            f"sockets={o['sockets']} pending={o['pending']} calls={o['calls']} frames={len(samples)}"
        )
        if samples:
            self.stdout.write(
                f"received -> frame on socket: p50={statistics.median(samples):.1f} ms "
                f"p99={pct(samples, 0.99):.1f} ms max={max(samples):.1f} ms"
            )
        if o["floor"] > 0:
            measured = floor.measure(o["floor"])
            for line in measured.lines():
                self.stdout.write(line)
            if samples and measured.hops:
                hop50, hop99 = statistics.median(measured.hops), pct(measured.hops, 0.99)
                self.stdout.write(
                    f"ratio to the floor hop: p50 {statistics.median(samples) / hop50:.1f}x, "
                    f"p99 {pct(samples, 0.99) / hop99:.1f}x "
                    f"(target: at most {targets.MAX_FLOOR_RATIO:g}x, unloaded)"
                )
        self.stdout.write(f"load average: {load_average()}")

    def _sessions(self, team: Team, count: int, stamp: int) -> list[str]:
        User = get_user_model()
        cookies = []
        for i in range(count):
            user = User.objects.create_user(f"bench-{stamp}-{i}")
            Membership.objects.create(team=team, user=user, role=Membership.Role.REVIEWER)
            session = SessionStore()
            session[SESSION_KEY] = str(user.pk)
            session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
            session[HASH_SESSION_KEY] = user.get_session_auth_hash()
            session.create()
            assert session.session_key is not None  # create() just saved it
            cookies.append(session.session_key)
        return cookies

    def _park(self, agent: Any, pending: int) -> None:
        for i in range(pending):
            calls.relay_submit(
                agent=agent,
                server_slug="demo",
                tool="parked",
                arguments={"n": i},
                input_requests={"ok": ENV_FORM},
            )

    async def _measure(
        self, hub: str, token: str, server: str, cookies: list[str], count: int
    ) -> tuple[list[str], dict[str, list[float]]]:
        ws_url = hub.replace("http", "ws", 1) + "/ws/queue/"
        arrivals: dict[str, list[float]] = {}

        async def listen(cookie: str, ready: asyncio.Event) -> None:
            headers = {"Cookie": f"sessionid={cookie}", "Origin": hub}
            async with websockets.connect(ws_url, additional_headers=headers, max_size=2**22) as socket:
                ready.set()
                async for raw in socket:
                    now = time.time()
                    message = json.loads(raw)
                    if message.get("type") == "card" and message.get("event") == "round.opened":
                        arrivals.setdefault(message["call"], []).append(now)

        readies = [asyncio.Event() for _ in cookies]
        listeners = [asyncio.create_task(listen(c, r)) for c, r in zip(cookies, readies, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        ids = []
        async with httpx2.AsyncClient(base_url=hub, headers={"Authorization": f"Bearer {token}"}) as agent:
            for i in range(count):
                response = await agent.post(
                    "/api/v1/calls",
                    json={
                        "server": server,
                        "tool": "create_deployment",
                        "arguments": {"branch": f"live-{i}"},
                    },
                )
                ids.append(response.json()["id"])
                deadline = time.monotonic() + 10
                while len(arrivals.get(ids[-1], [])) < len(cookies) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
        for task in listeners:
            task.cancel()
        return ids, arrivals
