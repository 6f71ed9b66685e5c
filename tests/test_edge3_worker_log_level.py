"""The Celery worker logs at ELICIT_LOG_LEVEL, as the hub's other processes do: the launcher's worker command
names no level of its own, and a worker started without ``--loglevel`` follows the setting; an explicit
``--loglevel`` still wins."""

from __future__ import annotations

import os
import uuid

import pytest

from elicit_hub import launch
from tests.live import Process, child_env, wait_until

pytestmark = pytest.mark.timeout(120)

# Celery logs this at DEBUG as the worker builds itself, before it prints its banner.
DEBUG_LINE = "DEBUG/MainProcess] | Worker: Preparing bootsteps."


def launched_worker_command() -> list[str]:
    """The launcher's worker command, without beat (nothing is scheduled from a test), on a solo pool."""
    layout = launch.Layout(holders=0, api=0, demo_port=None, port=18000)
    worker = launch.commands(layout)["worker"]
    command = [arg for arg in worker if not arg.startswith(("--beat", "--schedule"))]
    quick = ["--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    name = command.index("-n")
    command[name + 1] = f"log-level-{os.getpid()}-{uuid.uuid4().hex[:6]}@%h"
    return [*command, *quick]


def started(command: list[str], **env: str) -> str:
    """The worker's output up to its banner's queue list (its start-up logging is written by then)."""
    process = Process(f"log-level-{uuid.uuid4().hex[:8]}", command, child_env(**env))
    proc = process.start().proc
    assert proc is not None
    try:
        wait_until(lambda: "[queues]" in process.log() or proc.poll() is not None, 60, what="the banner")
        return process.log()
    finally:
        process.stop()
        process.log_path.unlink(missing_ok=True)


def test_the_launched_worker_follows_elicit_log_level() -> None:
    assert not any(arg.startswith(("--loglevel", "-l")) for arg in launched_worker_command())
    output = started(launched_worker_command(), ELICIT_LOG_LEVEL="debug")
    assert "[queues]" in output, output[-3000:]
    assert DEBUG_LINE in output


def test_an_explicit_loglevel_wins_over_the_setting() -> None:
    output = started([*launched_worker_command(), "--loglevel=WARNING"], ELICIT_LOG_LEVEL="DEBUG")
    assert "[queues]" in output, output[-3000:]
    assert DEBUG_LINE not in output
