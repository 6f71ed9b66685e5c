"""Scale-out: the load benchmark against 2 web processes, 2 API servers, 2 workers and 2 holders, then against
one of each.

Both hubs run on the same PostgreSQL and Redis (the engines the settings name), started from the launcher's
process list (``python -m elicit_hub.launch --web 2 --api 2 --workers 2 --holders 2``), with the load of
``bench/load.py``: agents and reviewer bots spread across the API servers, sockets across the web
processes. After each run it checks that nothing was lost or done twice: every submitted call completed,
each exactly once in the audit log, its one round answered once; and that the audit chain verifies. Then it
prints the ratio of the two runs' throughput and CPU per call. On a 2-core machine this shows correctness
and overhead, not gains.

    make bench-scale
    make bench BENCH="scale --duration 60 --agents 16"
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from approvals.audit import core as audit
from approvals.models import AuditEvent, InputRequest, ToolCall
from bench.load import Command as Load
from bench.procs import load_average


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--web-processes", type=int, default=2)
        parser.add_argument("--api-processes", type=int, default=2)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--holders", type=int, default=2)
        parser.add_argument("--agents", type=int, default=8)
        parser.add_argument("--reviewers", type=int, default=2)
        parser.add_argument("--duration", type=float, default=30.0, help="seconds of counted load per run")
        parser.add_argument("--rate", type=float, default=0.0, help="offered calls/s (0: closed loop)")
        parser.add_argument("--debug", action="store_true", help="run the hub's processes with DEBUG on")

    def handle(self, *args: Any, **o: Any) -> None:
        layouts = (
            ("scaled", o["web_processes"], o["api_processes"], o["workers"], o["holders"]),
            ("single", 1, 1, 1, 1),
        )
        results: dict[str, dict[str, Any]] = {}
        failed = False
        for label, web, api, workers, holders in layouts:
            self.stdout.write(f"\n== {label}: {web} web, {api} API, {workers} workers, {holders} holders ==")
            load = Load(stdout=sys.stdout, stderr=sys.stderr)
            call_command(
                load,
                web_processes=web,
                api_processes=api,
                workers=workers,
                holders=holders,
                agents=o["agents"],
                reviewers=o["reviewers"],
                duration=o["duration"],
                rate=o["rate"],
                debug=o["debug"],
            )
            results[label] = load.outcome
            problems = self._check(load.outcome)
            for problem in problems:
                self.stdout.write(f"  CHECK FAILED: {problem}")
            failed = failed or bool(problems)
            if not problems:
                self.stdout.write(
                    f"checks: {len(load.outcome['calls'])} calls, every one completed exactly once "
                    "(its round answered once), the audit chain verifies"
                )
        scaled, single = results["scaled"], results["single"]
        self.stdout.write("\n== ratio, scaled / single ==")
        for what, key, unit in (
            ("throughput", "throughput", "calls/s"),
            ("hub CPU per call", "cpu_ms_per_call", "ms"),
        ):
            a, b = scaled[key], single[key]
            self.stdout.write(f"{what}: {a:.1f} / {b:.1f} {unit} = {a / max(b, 1e-9):.2f}")
        self.stdout.write(f"load average now: {load_average()}")
        if failed:
            raise CommandError("a correctness check failed (above)")

    def _check(self, outcome: dict[str, Any]) -> list[str]:
        problems = []
        ids = outcome["calls"]
        if outcome["submits_failed"]:
            problems.append(f"{outcome['submits_failed']} submits got no call")
        if outcome["errors"]:
            problems.append(f"{len(outcome['errors'])} errors, first: {outcome['errors'][0]}")
        calls = ToolCall.objects.filter(server__slug=outcome["server"])
        if calls.count() != len(ids):
            problems.append(f"{calls.count()} calls stored for {len(ids)} submitted")
        not_done = calls.exclude(status=ToolCall.Status.COMPLETED).values_list("status", flat=True)
        if not_done:
            problems.append(f"{len(not_done)} calls not completed: {sorted(set(not_done))}")
        done = dict(
            AuditEvent.objects.filter(verb="call.completed", call_id__in=ids)
            .values_list("call_id")
            .annotate(n=Count("id"))
            .values_list("call_id", "n")
        )
        twice = [str(c) for c, n in done.items() if n != 1]
        if len(done) != len(ids) or twice:
            problems.append(
                f"{len(ids) - len(done)} calls never audited completed, {len(twice)} more than once"
            )
        answers = InputRequest.objects.filter(round__call_id__in=ids)
        if answers.count() != len(ids) or answers.exclude(status=InputRequest.Status.ANSWERED).exists():
            problems.append("not exactly one answered request per call")
        report = audit.verify()
        if not report.ok:
            problems.append(f"audit chain broken at {report.first_bad_id}: {report.problem}")
        return problems
