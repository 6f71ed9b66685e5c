"""Every target of the performance issue, in one command: the runs that judge them, one after the other.

1. the closed loop (``load``): throughput with zero errors, the hub's CPU per completed call;
2. an offered 20 calls/s (``load --rate 20``): input_required received -> inbox and -> socket p99, answer
   POST -> retry received p99;
3. unloaded (``load --rate 1``): a new round's card on a socket against the engines' floor, measured by the
   same run;
4. 1,000 idle reviewer sockets on one Daphne process (``sockets``).

Each run prints its own report and ``target:`` lines as it does alone; the suite then prints them together,
with how many were met. A run that fails is reported and the others still run. About four minutes.

    make bench                                   # this suite (the Makefile's default)
    make bench BENCH="suite --duration 60 --idle 120"
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand

from bench import targets
from bench.load import Command as Load
from bench.procs import load_average
from bench.sockets import Command as Sockets


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--duration", type=float, default=30.0, help="seconds of counted load per loaded run"
        )
        parser.add_argument("--unloaded-calls", type=int, default=30, help="calls counted at 1 call/s")
        parser.add_argument("--sockets", type=int, default=targets.IDLE_SOCKETS)
        parser.add_argument("--idle", type=float, default=60.0, help="seconds the sockets are held idle")

    def handle(self, *args: Any, **o: Any) -> None:
        runs: list[tuple[str, type[BaseCommand], dict[str, Any]]] = [
            ("closed loop", Load, {"duration": o["duration"]}),
            (
                f"offered {targets.LOADED_RATE:g} calls/s",
                Load,
                {"rate": targets.LOADED_RATE, "duration": o["duration"]},
            ),
            ("unloaded", Load, {"rate": targets.UNLOADED_RATE, "calls": o["unloaded_calls"]}),
            ("idle sockets", Sockets, {"sockets": o["sockets"], "idle": o["idle"]}),
        ]
        results: list[tuple[str, list[str] | None]] = []
        for name, kind, options in runs:
            self.stdout.write(f"\n== {name} ==")
            command = kind(stdout=sys.stdout, stderr=sys.stderr)
            try:
                call_command(command, **options)
            except Exception as exc:  # reported; the other targets are still measured
                self.stderr.write(f"{name}: the run failed: {type(exc).__name__}: {exc}")
                results.append((name, None))
                continue
            results.append((name, list(getattr(command, "verdicts", []))))
        self.stdout.write(f"\n== every target (load average now {load_average()}) ==")
        for line in targets.tally(results):
            self.stdout.write(line)
