"""Run one benchmark: ``python -m bench NAME [options]`` (``make bench BENCH="NAME [options]"``).

    suite        every target of the performance issue: the runs below that judge them, one after the other
    load         agents and bot reviewers under load through the API: calls/s, latencies, CPU per call
    requests     the web process's CPU per API request, endpoint by endpoint
    sends        the MCP client's CPU per send, as a worker sends (no database work)
    scale        the load against 2 web processes, 2 workers, 2 holders, then one of each: the ratio
    loop         the whole loop against a running hub: per-hop latency from stored timestamps
    live         input_required received -> card frame on reviewers' websockets, against a running hub
    seed_audit   append N realistic, correctly chained audit events (use a throwaway database)
    audit        the audit page's queries on a seeded database: p50/p95 per kind, EXPLAIN
    holder       N idle handshake-era sessions in one holder: its CPU and memory; push -> reviewer latency
    gateway      pass-through on /mcp against a running hub: question -> agent's client, answer -> result
    sockets      N idle reviewer websockets on one Daphne process: its CPU and memory
    grants       grants.find and the dashboard's grant suggestion on seeded data (rolled back)

``python -m bench NAME --help`` lists a benchmark's options. Each is a Django command run on the hub's
settings, so ``DATABASE_URL`` and ``REDIS_URL`` choose the engines, as for ``manage.py``.
"""

from __future__ import annotations

import importlib
import os
import sys

NAMES = (
    "suite",
    "load",
    "requests",
    "sends",
    "scale",
    "loop",
    "live",
    "seed_audit",
    "audit",
    "holder",
    "gateway",
    "sockets",
    "grants",
)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in NAMES:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")
    # Development mode unless told otherwise, as `make run` (a benchmark's hub is a development hub).
    os.environ.setdefault("DJANGO_DEBUG", "true")
    import django

    django.setup()
    command = importlib.import_module(f"bench.{argv[0]}").Command()
    command.run_from_argv(["bench", argv[0], *argv[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
