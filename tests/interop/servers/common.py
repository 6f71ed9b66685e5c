"""What the interop servers share: a run counter per tool, served at /runs for the tests to read.

Pure standard library: the FastMCP 2.x server imports it from its own virtual environment.
"""

from __future__ import annotations

import argparse
from collections import Counter

RUNS: Counter[str] = Counter()


def ran(tool: str) -> None:
    """A tool body started: the count the tests compare with what the hub sent."""
    RUNS[tool] += 1


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    return parser.parse_args()


def outcome_text(action: str, content: object) -> str:
    """How each server reports what the person answered, so tests compare it with what was typed."""
    return f"{action}: {content}" if action == "accept" else action
