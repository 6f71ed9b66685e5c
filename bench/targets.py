"""Issue 15's targets, judged on one run of the load benchmark (pure logic: `bench.load` passes its figures).

Which targets a run can speak to depends on its load:
- a closed loop (no offered rate): the throughput with zero errors, and the hub's CPU per completed call;
- an offered rate of 20 calls/s or more: the p99 of ``input_required`` received -> visible to a reviewer
  (inbox and socket) and of answer POST -> retry received by the MCP server;
- an offered rate of 1 call/s or less (unloaded): a new round's card on an open socket against the engines'
  floor for one hop, a PostgreSQL commit plus a Redis publish reaching a subscriber, paired sample by sample
  (``bench.floor``, as ``shared/tools/floor.py`` measures it).

Any other rate judges nothing: its figures are printed, not held against a target they were not made for.
``bench sockets`` judges the last target (``judge_idle_sockets``): 1,000 idle reviewer sockets on one Daphne
process cost at most a tenth of a core, and a new round still reaches every one of them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.stats import pct

MIN_THROUGHPUT = 40.0  # calls/s, closed loop, zero errors
MAX_CPU_PER_CALL = 25.0  # ms of hub CPU per completed call, closed loop
LOADED_RATE = 20.0  # calls/s offered for the latency targets
MAX_VISIBLE_P99 = 100.0  # ms, input_required received -> inbox and -> socket
MAX_RETRY_P99 = 250.0  # ms, answer POST -> retry received
UNLOADED_RATE = 1.0  # calls/s offered at most for the floor ratio
MAX_FLOOR_RATIO = 10.0
IDLE_SOCKETS = 1000
MAX_IDLE_CPU = 10.0  # % of one core


@dataclass(frozen=True)
class Figures:
    """What one run measured; latencies in ms, one sample per counted call."""

    rate: float  # offered calls/s; 0 for a closed loop
    throughput: float
    errors: int
    cpu_per_call: float
    to_inbox: list[float]
    to_socket: list[float]
    to_retry: list[float]
    floor_hops: list[float]  # commit + publish, paired


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def judge(f: Figures) -> list[str]:
    """One line per target the run speaks to: the figure, the target and whether it was met."""
    lines: list[str] = []
    if f.rate <= 0:
        ok = f.throughput >= MIN_THROUGHPUT and f.errors == 0
        lines.append(
            f"closed loop >= {MIN_THROUGHPUT:g} calls/s with 0 errors: {f.throughput:.1f} calls/s, "
            f"{f.errors} errors: {_verdict(ok)}"
        )
        lines.append(
            f"hub CPU per completed call <= {MAX_CPU_PER_CALL:g} ms: {f.cpu_per_call:.1f} ms: "
            f"{_verdict(f.cpu_per_call <= MAX_CPU_PER_CALL)}"
        )
        return lines
    if f.rate >= LOADED_RATE:
        for label, values, limit in (
            ("input_required received -> inbox", f.to_inbox, MAX_VISIBLE_P99),
            ("input_required received -> socket", f.to_socket, MAX_VISIBLE_P99),
            ("answer POST -> retry received", f.to_retry, MAX_RETRY_P99),
        ):
            if not values:
                lines.append(f"{label} p99 <= {limit:g} ms: no samples: NOT met")
                continue
            p99 = pct(values, 0.99)
            lines.append(
                f"{label} p99 <= {limit:g} ms at an offered {f.rate:g} calls/s: {p99:.1f} ms: "
                f"{_verdict(p99 <= limit)}"
            )
        if f.throughput < f.rate * 0.9:
            lines.append(
                f"(the hub completed {f.throughput:.1f} calls/s of the {f.rate:g} offered: "
                "it did not keep up)"
            )
        return lines
    if f.rate <= UNLOADED_RATE:
        if not f.floor_hops or not f.to_socket:
            lines.append(f"unloaded, socket within {MAX_FLOOR_RATIO:g}x the floor: no samples: NOT met")
            return lines
        seen, floor = statistics.median(f.to_socket), statistics.median(f.floor_hops)
        ratio = seen / floor if floor > 0 else float("inf")
        lines.append(
            f"unloaded, card on socket p50 within {MAX_FLOOR_RATIO:g}x the floor (commit + publish, "
            f"p50 {floor:.2f} ms): {seen:.1f} ms, {ratio:.1f}x: {_verdict(ratio <= MAX_FLOOR_RATIO)}"
        )
    return lines


def judge_idle_sockets(*, sockets: int, cpu_percent: float, reached: int) -> list[str]:
    """The idle sockets' target: at least IDLE_SOCKETS held at most MAX_IDLE_CPU % of a core, and every one
    of them got the new round's card (an idle socket that no longer hears is cheap for the wrong reason)."""
    if sockets < IDLE_SOCKETS:
        return [f"{IDLE_SOCKETS:,} idle sockets: only {sockets:,} held: not judged"]
    ok = cpu_percent <= MAX_IDLE_CPU and reached == sockets
    return [
        f"{sockets:,} idle sockets on one Daphne process <= {MAX_IDLE_CPU:g} % of a core, every one reached: "
        f"{cpu_percent:.1f} %, {reached:,} of {sockets:,} reached: {_verdict(ok)}"
    ]


def tally(runs: list[tuple[str, list[str] | None]]) -> list[str]:
    """``bench suite``'s closing table: each run's name, its verdicts under it, how many were met.

    A run given None did not finish (its error is printed above the table): it counts as a target not met,
    never as one left out. Lines that are not verdicts (a note such as "did not keep up") are shown, not
    counted; nor is a target a run could not judge."""
    lines: list[str] = []
    met = judged = 0
    for name, verdicts in runs:
        lines.append(f"{name}:")
        if verdicts is None:
            lines.append("  the run did not finish: NOT met")
            judged += 1
            continue
        for verdict in verdicts or ["no target judged"]:
            lines.append(f"  {verdict}")
            if verdict.endswith(": met"):
                met += 1
                judged += 1
            elif verdict.endswith(": NOT met"):
                judged += 1
    lines.append(f"{met} of {judged} targets met")
    return lines
