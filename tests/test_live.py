"""The test suite's own processes (`tests.live`): a run cut short leaves none of them behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.live import ROOT, wait_until

PARENT = """
import sys, time
from tests.live import Process
child = Process("left-behind-check", [sys.executable, "-c", "import time; time.sleep(120)"], {}).start()
print(child.proc.pid, flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie nobody reaped yet does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def test_a_process_a_test_started_ends_when_the_test_run_is_killed() -> None:
    """A worker left by a killed run would take the next run's tasks from the same queue (and keep its test
    database open): the suite's processes end with the process that started them."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _running(child)
        parent.kill()  # SIGKILL: no clean-up code of the run's own gets to run
        parent.wait(10)
        wait_until(lambda: not _running(child), timeout=10, what="the left-behind process to end")
    finally:
        parent.kill()
        if child and _running(child):
            os.kill(child, signal.SIGKILL)
