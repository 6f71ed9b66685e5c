"""How the load benchmark judges a run against issue 15's targets (pure logic)."""

from __future__ import annotations

from typing import Any

from bench.stats import pct
from bench.targets import Figures, judge, judge_idle_sockets, tally


def figures(**given: Any) -> Figures:
    values: dict[str, Any] = {
        "rate": 0.0,
        "throughput": 0.0,
        "errors": 0,
        "cpu_per_call": 0.0,
        "to_inbox": [],
        "to_socket": [],
        "to_retry": [],
        "floor_hops": [],
    }
    values.update(given)
    return Figures(**values)


def test_a_closed_loop_is_judged_on_throughput_errors_and_cpu() -> None:
    met = judge(figures(throughput=41.0, cpu_per_call=24.0))
    assert met == [
        "closed loop >= 40 calls/s with 0 errors: 41.0 calls/s, 0 errors: met",
        "hub CPU per completed call <= 25 ms: 24.0 ms: met",
    ]
    slow = judge(figures(throughput=18.2, cpu_per_call=74.5))
    assert [line.rsplit(": ", 1)[1] for line in slow] == ["NOT met", "NOT met"]


def test_errors_fail_the_throughput_target_however_fast() -> None:
    (line, _) = judge(figures(throughput=90.0, errors=1, cpu_per_call=10.0))
    assert line.endswith("90.0 calls/s, 1 errors: NOT met")


def test_an_offered_twenty_calls_is_judged_on_the_three_p99s() -> None:
    fast = [10.0] * 99 + [99.0]
    lines = judge(
        figures(rate=20.0, throughput=19.8, to_inbox=fast, to_socket=fast + [101.0] * 5, to_retry=[240.0])
    )
    assert lines == [
        "input_required received -> inbox p99 <= 100 ms at an offered 20 calls/s: 99.0 ms: met",
        "input_required received -> socket p99 <= 100 ms at an offered 20 calls/s: 101.0 ms: NOT met",
        "answer POST -> retry received p99 <= 250 ms at an offered 20 calls/s: 240.0 ms: met",
    ]


def test_a_hub_that_did_not_keep_up_with_the_offered_rate_is_said_to_have_fallen_behind() -> None:
    lines = judge(figures(rate=20.0, throughput=15.0, to_inbox=[1.0], to_socket=[1.0], to_retry=[1.0]))
    assert lines[-1] == "(the hub completed 15.0 calls/s of the 20 offered: it did not keep up)"


def test_a_loaded_target_without_samples_is_not_met() -> None:
    lines = judge(figures(rate=20.0, throughput=20.0, to_inbox=[5.0], to_retry=[5.0]))
    assert "input_required received -> socket p99 <= 100 ms: no samples: NOT met" in lines


def test_unloaded_the_socket_is_held_against_the_median_hop() -> None:
    # Hops (commit + publish, paired) 0.4, 0.5, 0.9: the median 0.5 ms; 4.5 ms is 9.0x, 5.5 ms 11.0x.
    hops = [0.9, 0.4, 0.5]
    (met,) = judge(figures(rate=1.0, to_socket=[4.0, 4.5, 30.0], floor_hops=hops))
    assert met.endswith("(commit + publish, p50 0.50 ms): 4.5 ms, 9.0x: met")
    (over,) = judge(figures(rate=0.5, to_socket=[5.5], floor_hops=hops))
    assert over.endswith("5.5 ms, 11.0x: NOT met")


def test_unloaded_without_a_floor_is_not_met() -> None:
    (line,) = judge(figures(rate=1.0, to_socket=[5.0]))
    assert line.endswith("no samples: NOT met")


def test_a_rate_between_unloaded_and_loaded_judges_nothing() -> None:
    assert judge(figures(rate=5.0, throughput=5.0, to_inbox=[500.0], to_socket=[500.0])) == []


def test_a_percentile_is_the_sample_at_index_q_times_n() -> None:
    samples = [float(n) for n in range(1, 101)]
    assert pct(samples, 0.99) == 100.0
    assert pct(samples, 0.5) == 51.0
    assert pct([3.0], 0.99) == 3.0


def test_a_thousand_idle_sockets_are_judged_on_cpu_and_on_every_one_hearing_the_new_round() -> None:
    (met,) = judge_idle_sockets(sockets=1000, cpu_percent=5.7, reached=1000)
    assert met == (
        "1,000 idle sockets on one Daphne process <= 10 % of a core, every one reached: "
        "5.7 %, 1,000 of 1,000 reached: met"
    )
    (busy,) = judge_idle_sockets(sockets=1000, cpu_percent=10.1, reached=1000)
    assert busy.endswith("NOT met")
    (deaf,) = judge_idle_sockets(sockets=1000, cpu_percent=1.0, reached=999)
    assert deaf.endswith("999 of 1,000 reached: NOT met")


def test_fewer_idle_sockets_than_the_target_names_are_not_judged() -> None:
    assert judge_idle_sockets(sockets=50, cpu_percent=0.5, reached=50) == [
        "1,000 idle sockets: only 50 held: not judged"
    ]


def test_the_suite_tallies_every_run_and_counts_a_failed_run_as_not_met() -> None:
    lines = tally(
        [
            ("closed loop", ["closed loop >= 40 calls/s with 0 errors: 35.2 calls/s, 0 errors: NOT met"]),
            (
                "offered 20 calls/s",
                [
                    "input_required received -> inbox p99 <= 100 ms at an offered 20 calls/s: 29.5 ms: met",
                    "(the hub completed 12.7 calls/s of the 20 offered: it did not keep up)",
                ],
            ),
            ("unloaded", None),
            ("idle sockets", ["1,000 idle sockets: only 200 held: not judged"]),
        ]
    )
    # Met: the inbox. Judged: the loop, the inbox, the failed run. Neither: the note, "not judged".
    assert lines == [
        "closed loop:",
        "  closed loop >= 40 calls/s with 0 errors: 35.2 calls/s, 0 errors: NOT met",
        "offered 20 calls/s:",
        "  input_required received -> inbox p99 <= 100 ms at an offered 20 calls/s: 29.5 ms: met",
        "  (the hub completed 12.7 calls/s of the 20 offered: it did not keep up)",
        "unloaded:",
        "  the run did not finish: NOT met",
        "idle sockets:",
        "  1,000 idle sockets: only 200 held: not judged",
        "1 of 3 targets met",
    ]


def test_a_run_that_judged_nothing_says_so() -> None:
    assert tally([("offered 5 calls/s", [])]) == [
        "offered 5 calls/s:",
        "  no target judged",
        "0 of 0 targets met",
    ]


def test_the_machine_speed_reference_chains_audit_hashes_and_times_each_run(monkeypatch) -> None:
    from approvals.audit.verify import GENESIS, event_hash
    from bench import floor

    monkeypatch.setattr(floor, "REFERENCE_HASHES", 2)
    once = event_hash(GENESIS, floor._REFERENCE_ROW)
    assert floor.reference_workload() == event_hash(once, floor._REFERENCE_ROW) != once
    timings = floor.cpu_reference(runs=3)
    assert len(timings) == 3 and all(t >= 0 for t in timings)
