"""Benchmark the whole loop against a running hub (`make run`): N calls, a bot reviewer on the API.

The figures come from the hop timestamps the hub stores on each round, not from stopwatches here:
  answer -> retry sent  Round.answered_at (the answer that completed it) -> Round.send_started_at
  throughput            calls / (last finished_at - first created_at)
`bench load` measures from outside what a reviewer sees: received -> visible in the inbox and on a socket.

    make bench BENCH="loop --calls 200 --concurrency 20"
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx2
from django.core.management.base import BaseCommand, CommandError

from approvals.models import McpServer, Membership, Round, Team, ToolCall
from approvals.services import tokens
from bench.stats import pct


def describe(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: no samples"
    return (
        f"{name}: p50={statistics.median(values):.1f} ms p95={pct(values, 0.95):.1f} ms "
        f"p99={pct(values, 0.99):.1f} ms n={len(values)}"
    )


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--hub", default="http://127.0.0.1:8000")
        parser.add_argument("--server", default="demo")
        parser.add_argument("--calls", type=int, default=100)
        parser.add_argument("--concurrency", type=int, default=10)

    def handle(self, *args: Any, hub: str, server: str, calls: int, concurrency: int, **options: Any) -> None:
        mcp_server = McpServer.objects.filter(slug=server).first()
        if mcp_server is None:
            raise CommandError(f"no server {server!r}; start `make run` first")
        agent_token, reviewer_token = self._credentials(mcp_server)
        started = time.monotonic()
        ids = asyncio.run(self._drive(hub, server, calls, concurrency, agent_token, reviewer_token))
        wall = time.monotonic() - started
        self._report(ids, wall)

    def _credentials(self, server: McpServer) -> tuple[str, str]:
        from django.contrib.auth import get_user_model

        stamp = int(time.time())
        _, agent_token = tokens.agent_create(name=f"bench-agent-{stamp}", servers=[server])
        bot, _ = get_user_model().objects.get_or_create(username="bench-reviewer")
        team = server.default_team or Team.objects.get_or_create(slug="bench", defaults={"name": "Bench"})[0]
        if server.default_team is None:
            server.default_team = team
            server.save(update_fields=["default_team"])
        Membership.objects.get_or_create(team=team, user=bot, defaults={"role": Membership.Role.REVIEWER})
        _, reviewer_token = tokens.personal_token_create(user=bot, name="bench")
        return agent_token, reviewer_token

    async def _drive(
        self, hub: str, server: str, calls: int, concurrency: int, agent_token: str, reviewer_token: str
    ) -> list[str]:
        limits = httpx2.Limits(max_connections=concurrency + 4)
        async with (
            httpx2.AsyncClient(
                base_url=hub, headers={"Authorization": f"Bearer {agent_token}"}, limits=limits, timeout=90
            ) as agent,
            httpx2.AsyncClient(
                base_url=hub, headers={"Authorization": f"Bearer {reviewer_token}"}, timeout=30
            ) as reviewer,
        ):
            ids: list[str] = []
            done = asyncio.Event()
            bot = asyncio.create_task(self._bot(reviewer, done))
            gate = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with gate:
                    response = await agent.post(
                        "/api/v1/calls",
                        json={
                            "server": server,
                            "tool": "create_deployment",
                            "arguments": {"branch": f"bench-{i}"},
                        },
                    )
                    response.raise_for_status()
                    call_id = response.json()["id"]
                    ids.append(call_id)
                    while True:
                        polled = await agent.get(f"/api/v1/calls/{call_id}", params={"wait": 60})
                        if polled.status_code != 200:
                            await asyncio.sleep(float(polled.headers.get("retry-after", 1)))
                            continue
                        body = polled.json()
                        if body["status"] not in ("queued", "running", "awaiting_input", "resuming"):
                            return

            await asyncio.gather(*(one(i) for i in range(calls)))
            done.set()
            await bot
            return ids

    async def _bot(self, reviewer: httpx2.AsyncClient, done: asyncio.Event) -> None:
        """A reviewer bot: polls the inbox and accepts every environment question with staging."""
        answered: set[str] = set()
        while not done.is_set():
            response = await reviewer.get("/api/v1/inbox")
            if response.status_code != 200:
                await asyncio.sleep(float(response.headers.get("retry-after", 1)))
                continue
            items = response.json()
            fresh = [i for i in items if i["id"] not in answered and i["tool"] == "create_deployment"]
            for item in fresh:
                answered.add(item["id"])
                await reviewer.post(
                    f"/api/v1/input-requests/{item['id']}/respond",
                    json={"action": "accept", "content": {"environment": "staging"}},
                )
            if not fresh:
                await asyncio.sleep(0.02)

    def _report(self, ids: list[str], wall: float) -> None:
        rounds = Round.objects.filter(call_id__in=ids)
        resend = [
            (r.send_started_at - r.answered_at).total_seconds() * 1000
            for r in rounds
            if r.send_started_at and r.answered_at
        ]
        calls = ToolCall.objects.filter(pk__in=ids)
        statuses = {s: calls.filter(status=s).count() for s in set(calls.values_list("status", flat=True))}
        first = min(c.created_at for c in calls)
        last = max(c.finished_at for c in calls if c.finished_at)
        span = (last - first).total_seconds()
        self.stdout.write(f"calls: {len(ids)} {statuses}")
        self.stdout.write(describe("answer POST -> retry sent to the server", resend))
        self.stdout.write(f"throughput: {len(ids) / span:.1f} calls/s over {span:.1f} s (wall {wall:.1f} s)")
