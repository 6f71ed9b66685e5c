"""The split of the suite between CI's two runs: every file in exactly one part, pins kept, loads even."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import shards


def test_parse_reads_k_of_n_and_refuses_the_rest() -> None:
    assert shards.parse("2/3") == (2, 3)
    for bad in ("", "2", "a/b", "0/2", "3/2", "1/0"):
        with pytest.raises(ValueError, match="--shard"):
            shards.parse(bad)


def test_every_file_lands_in_exactly_one_part_and_pins_hold() -> None:
    files = [
        "tests/browser/test_a.py",
        "tests/interop/test_b.py",
        "tests/test_scaleout.py",
        *[f"tests/test_{i:02}.py" for i in range(20)],
    ]
    placed = shards.plan(files, 2, {})
    assert set(placed) == set(files)
    assert set(placed.values()) == {1, 2}
    assert placed["tests/browser/test_a.py"] == 1
    assert placed["tests/interop/test_b.py"] == 2
    assert placed["tests/test_scaleout.py"] == 2
    # A pin to a part beyond N goes to the last part rather than nowhere.
    assert shards.plan(["tests/interop/test_b.py"], 1, {}) == {"tests/interop/test_b.py": 1}


def test_heaviest_first_evens_the_loads_and_unknown_files_weigh_the_median() -> None:
    weights = {
        "tests/test_a.py": 100.0,
        "tests/test_b.py": 60.0,
        "tests/test_c.py": 40.0,
        "tests/test_d.py": 2.0,
    }
    placed = shards.plan([*weights, "tests/test_new.py"], 2, weights, pinned={})
    # a (100) -> 1; b (60) -> 2; the new file (50, the median) -> 2 (110); c (40) -> 1 (140); d (2) -> 2.
    assert placed == {
        "tests/test_a.py": 1,
        "tests/test_b.py": 2,
        "tests/test_new.py": 2,
        "tests/test_c.py": 1,
        "tests/test_d.py": 2,
    }


def test_the_split_does_not_depend_on_the_order_files_are_listed() -> None:
    files = [f"tests/test_{i:03}.py" for i in range(50)]
    weights = {path: float(i % 7 + 1) for i, path in enumerate(files)}
    assert shards.plan(files, 2, weights) == shards.plan(list(reversed(files)), 2, weights)


def test_kept_gives_the_two_runs_complementary_halves_of_the_real_suite() -> None:
    paths = [shards.ROOT / path for path in shards.suite_files()]
    first = shards.kept(paths, "1/2")
    second = shards.kept(paths, "2/2")
    assert all(a != b for a, b in zip(first, second, strict=True))
    assert 0.3 < sum(first) / len(paths) < 0.7
    assert shards.kept([shards.ROOT / "tests/browser/test_dashboard.py"], "1/2") == [True]
    assert shards.kept([shards.ROOT / "tests/interop/test_push.py"], "2/2") == [True]


def test_weights_come_from_junit_reports_summed_per_file(tmp_path: Path) -> None:
    root = tmp_path
    (root / "tests" / "browser").mkdir(parents=True)
    (root / "tests" / "test_x.py").write_text("")
    (root / "tests" / "browser" / "test_y.py").write_text("")
    report = tmp_path / "r.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.test_x" name="t1" time="1.25"/>'
        '<testcase classname="tests.test_x" name="t2" time="2.5"/>'
        '<testcase classname="tests.browser.test_y.TestPage" name="t3" time="4"/>'
        '<testcase classname="tests.test_gone" name="t4" time="9"/>'
        '<testcase classname="conftest" name="t5" time="9"/>'
        "</testsuite></testsuites>"
    )
    weights = shards.weights_from_junit([report], root=root)
    assert weights == {"tests/browser/test_y.py": 4.0, "tests/test_x.py": 3.8}
    stored = tmp_path / "w.json"
    stored.write_text(json.dumps(weights))
    assert shards.load_weights(stored) == weights
    assert shards.load_weights(tmp_path / "missing.json") == {}
