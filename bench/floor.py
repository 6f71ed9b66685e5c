"""The engines' floor for one hub hop, measured in the benchmark's own run, as ../shared/tools/floor.py does.

A hub delivery needs at least one PostgreSQL commit (the row) and one Redis publish reaching a subscriber
(the channel layer). This measures both on the engines the settings name, the commit through Django's own
connection (the hub's driver, pool and settings), the publish with redis-py on ``REDIS_URL``, paired into a
hop (commit + publish) per sample, so a ratio hub / floor holds when the machine is slow or busy.

Beside it, the machine's speed at the hub's kind of work (``cpu_reference``): the same fixed CPU-only workload
every run, so CPU per call measured on two machines (or on one machine, busy and quiet) can be compared.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import connection, transaction

from approvals.audit.verify import GENESIS, event_hash
from bench.stats import pct

# One audit event as the chain hashes it: the reference workload canonicalises and hashes it again and again.
_REFERENCE_ROW = {
    "id": 1,
    "at": "2026-01-01T00:00:00+00:00",
    "actor_type": "system",
    "actor_id": "",
    "actor_label": "hub",
    "verb": "input.requested",
    "call_id": "00000000-0000-0000-0000-000000000001",
    "input_request_id": "00000000-0000-0000-0000-000000000002",
    "server": "deploys",
    "team": "release",
    "tool": "create_deployment",
    "action": "",
    "outcome": "",
    "data": {"key": "approve", "mode": "form", "message": "Deploy 2.4.1 to production?", "flags": []},
    "prev_hash": GENESIS,
    "hash": "",
}
REFERENCE_HASHES = 2000


@dataclass
class Floor:
    commits: list[float]
    publishes: list[float]

    @property
    def hops(self) -> list[float]:
        return [c + p for c, p in zip(self.commits, self.publishes, strict=False)]

    def lines(self) -> list[str]:
        rows = (
            ("floor_commit_ms", self.commits),
            ("floor_publish_ms", self.publishes),
            ("floor_hop_ms", self.hops),
        )
        return [
            f"{name} p50={statistics.median(values):.3f} p99={pct(values, 0.99):.3f} n={len(values)}"
            for name, values in rows
            if values
        ]


def reference_workload() -> str:
    """A fixed CPU-only piece of the hub's work: REFERENCE_HASHES audit hashes, each chained to the last."""
    previous = GENESIS
    for _ in range(REFERENCE_HASHES):
        previous = event_hash(previous, _REFERENCE_ROW)
    return previous


def cpu_reference(runs: int = 7) -> list[float]:
    """How long the reference workload takes here (ms per run, in process CPU time, so waiting for a core
    does not count): a faster machine takes less. Printed beside the floor to compare CPU per call."""
    reference_workload()  # warm
    timings = []
    for _ in range(runs):
        t0 = time.process_time()
        reference_workload()
        timings.append((time.process_time() - t0) * 1000)
    return timings


def measure(n: int = 500) -> Floor:
    commits: list[float] = []
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS floor_probe "
            "(id bigserial PRIMARY KEY, at timestamptz, body text)"
        )
    for i in range(n):
        t0 = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO floor_probe (at, body) VALUES (now(), %s)", [f"probe {i}"])
        commits.append((time.perf_counter() - t0) * 1000)

    client = redis.Redis.from_url(settings.REDIS_URL)
    sub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    sub.subscribe("floor-probe")
    sub.get_message(timeout=1.0)  # the subscribe confirmation
    publishes: list[float] = []
    received = threading.Event()
    stamp = [0.0]

    def listen() -> None:
        try:
            for message in sub.listen():
                if message["type"] == "message":
                    publishes.append((time.perf_counter() - stamp[0]) * 1000)
                    received.set()
        except Exception:  # the subscription closed below, once every sample is in: whatever it raises
            return

    threading.Thread(target=listen, daemon=True).start()
    for i in range(n):
        received.clear()
        stamp[0] = time.perf_counter()
        client.publish("floor-probe", str(i))
        received.wait(2.0)
    sub.close()
    client.close()
    return Floor(commits, publishes)
