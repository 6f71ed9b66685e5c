"""Split the suite into parts that run side by side, each test file in exactly one part.

CI runs the suite twice at once, on the machine's engines and on the embedded ones; giving each run half of
the files (instead of all of them) halves the time on two cores. The split is computed from the files on
disk and the weights recorded in ``tests/shard_weights.json`` (seconds per file from an earlier run), so
every run of the same tree computes the same split whatever it collects. Some directories are pinned to
one part: the browser tests need Chromium, the interop tests the third-party servers installed beside the
embedded run.

``python -m tests.shards var/ci-*.xml`` rewrites the weights from JUnit reports (``--junitxml``).
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = ROOT / "tests" / "shard_weights.json"

# Path prefix -> part (1-based). The first part runs on the machine's engines in CI, the second on the
# embedded ones, where the interop servers are installed.
PINNED: dict[str, int] = {
    "tests/browser/": 1,
    "tests/interop/": 2,
    "tests/test_scaleout.py": 2,
}


def parse(spec: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), with 1 <= K <= N."""
    part, _, total = spec.partition("/")
    try:
        k, n = int(part), int(total)
    except ValueError:
        raise ValueError(f"--shard wants K/N, such as 1/2; got {spec!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard {spec!r}: K must be between 1 and N")
    return k, n


def suite_files(root: Path = ROOT) -> list[str]:
    """Every test file under tests/, as a path relative to the repository, sorted."""
    return sorted(path.relative_to(root).as_posix() for path in (root / "tests").rglob("test_*.py"))


def pinned_part(path: str, parts: int, pinned: Mapping[str, int] = PINNED) -> int | None:
    for prefix, part in pinned.items():
        if path.startswith(prefix):
            return min(part, parts)
    return None


def plan(
    files: Iterable[str],
    parts: int,
    weights: Mapping[str, float],
    pinned: Mapping[str, int] = PINNED,
) -> dict[str, int]:
    """Each file's part (1-based): pinned files first, then the rest heaviest first into the lightest part.

    A file with no recorded weight counts as the median of the recorded ones.
    """
    files = sorted(set(files))
    known = [weights[f] for f in files if f in weights]
    default = statistics.median(known) if known else 1.0
    load = [0.0] * parts
    placed: dict[str, int] = {}
    free: list[str] = []
    for path in files:
        part = pinned_part(path, parts, pinned)
        if part is None:
            free.append(path)
        else:
            placed[path] = part
            load[part - 1] += weights.get(path, default)
    for path in sorted(free, key=lambda f: (-weights.get(f, default), f)):
        lightest = min(range(parts), key=lambda i: (load[i], i))
        placed[path] = lightest + 1
        load[lightest] += weights.get(path, default)
    return placed


def kept(paths: Iterable[Path], spec: str, root: Path = ROOT) -> list[bool]:
    """For each collected test's file, whether the part ``spec`` ("K/N") runs it."""
    part, parts = parse(spec)
    placed = plan(suite_files(root), parts, load_weights(root / "tests" / "shard_weights.json"))
    return [placed.get(path.resolve().relative_to(root).as_posix(), 1) == part for path in paths]


def load_weights(path: Path = WEIGHTS) -> dict[str, float]:
    if not path.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}


def weights_from_junit(reports: Iterable[Path], root: Path = ROOT) -> dict[str, float]:
    """Seconds per test file, summed over the test cases of JUnit reports."""
    seconds: dict[str, float] = defaultdict(float)
    for report in reports:
        # The project's own CI reports, not outside input.
        for case in ElementTree.parse(report).iter("testcase"):  # noqa: S314
            classname = case.get("classname", "")
            # "tests.browser.test_x.TestY" or "tests.test_x": the module is the part up to "test_*".
            pieces = classname.split(".")
            module = next((i for i, p in enumerate(pieces) if p.startswith("test_")), None)
            if module is None:
                continue
            path = "/".join(pieces[: module + 1]) + ".py"
            if (root / path).exists():
                seconds[path] += float(case.get("time", "0") or 0)
    return {path: round(total, 1) for path, total in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.shards REPORT.xml [...]", file=sys.stderr)
        return 2
    weights = weights_from_junit(Path(a) for a in argv)
    WEIGHTS.write_text(json.dumps(weights, indent=1, sort_keys=True) + "\n")
    parts = plan(suite_files(), 2, weights)
    totals = defaultdict(float)
    for path, part in parts.items():
        totals[part] += weights.get(path, 0.0)
    print(f"{len(weights)} files; seconds per part: {dict(sorted(totals.items()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
