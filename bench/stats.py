"""What every benchmark reports of its samples."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0 < q < 1) of the samples: the sorted sample at index int(q * n), so that of 100
    samples p50 is the 51st and p99 the 100th (the largest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
