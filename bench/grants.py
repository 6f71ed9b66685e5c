"""Benchmark the grants' two queries: the gate's ``grants.find`` and the dashboard's suggestion.

    make bench BENCH="grants --decisions 200000 --grants 2000 --runs 200"

Seeds gate decisions in the audit log and grants for one agent inside one transaction, times each query
end to end through the ORM (p50/p95), prints the suggestion's EXPLAIN, then rolls everything back.
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction
from django.utils import timezone

from approvals.audit import core as audit
from approvals.models import AgentClient, Grant, McpServer, Team, ToolCall
from approvals.services import grants


def timed(runs: int, query: Any) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        query()
        samples.append((time.perf_counter() - start) * 1000)
    ordered = sorted(samples)
    return statistics.median(samples), ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


class Command(BaseCommand):
    help = "Time grants.find and the grant suggestion on seeded data (rolled back afterwards)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--decisions", type=int, default=200_000, help="gate decisions in the audit log")
        parser.add_argument("--grants", type=int, default=2_000, help="grants of the one agent")
        parser.add_argument("--runs", type=int, default=200)

    def handle(self, *args: Any, **options: Any) -> None:
        rng = random.Random(1)
        with transaction.atomic():
            user = get_user_model().objects.create_superuser("bench-grants", password=None)
            team = Team.objects.create(slug="bench-grants", name="Bench grants")
            server = McpServer.objects.create(slug="bench-grants", name="Bench", url="http://127.0.0.1:9/mcp")
            agent = AgentClient.objects.create(name="bench-grants", token_hash="0" * 64, token_prefix="b")  # noqa: S106  (no token)
            now = timezone.now()
            rows: list[dict[str, Any]] = [
                {
                    "at": now - timedelta(days=rng.uniform(0, 60)),
                    "actor_type": "user",
                    "actor_id": "",
                    "actor_label": "bench",
                    "verb": "gate.declined" if rng.random() < 0.02 else "gate.approved",
                    "server_slug": f"s{rng.randrange(20)}",
                    "team_slug": f"t{rng.randrange(10)}",
                    "tool": f"tool_{rng.randrange(50)}",
                    "data": {},
                }
                for _ in range(options["decisions"])
            ]
            audit.append_many(rows)
            Grant.objects.bulk_create(
                Grant(
                    agent=agent,
                    server=server,
                    tool=f"tool_{n % 50}",
                    tool_digest="d" * 64,
                    arguments_mode="conditions",
                    conditions=[{"argument": "n", "op": "==", "value": n}],
                    team=team,
                    granted_by=user,
                    expires_at=now + timedelta(hours=8),
                )
                for n in range(options["grants"])
            )
            call = ToolCall(agent=agent, server=server, tool="tool_7", arguments={"n": 7})
            runs = options["runs"]
            p50, p95 = timed(runs, lambda: grants.find(call=call, tool_digest="d" * 64))
            self.stdout.write(
                f"find: {options['grants']:,} grants of the agent, p50 {p50:.2f} ms, p95 {p95:.2f} ms"
            )
            p50, p95 = timed(runs, lambda: list(grants.suggestion_query(None)))
            self.stdout.write(
                f"suggestion: {options['decisions']:,} gate decisions, p50 {p50:.2f} ms, p95 {p95:.2f} ms"
            )
            sql, params = grants.suggestion_query(None).query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + sql, params)
                self.stdout.write("\n".join(row[0] for row in cursor.fetchall()))
            transaction.set_rollback(True)
