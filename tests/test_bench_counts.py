"""What the load benchmark counts beside the hub: the Redis commands per call and the processes that share
the machine's cores with it (pure logic, and this process's own children)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.load import NOT_THE_HUB, CpuSample, EngineCounts


def test_engine_counts_subtract_command_by_command_and_drop_the_unchanged() -> None:
    before = EngineCounts({"incrby": 10, "get": 4, "ping": 2}, pg_transactions=100)
    after = EngineCounts({"incrby": 30, "get": 4, "ping": 3, "publish": 5}, pg_transactions=160)
    run = after - before
    assert run.redis_by_command == {"incrby": 20, "ping": 1, "publish": 5}
    assert run.redis_commands == 26
    assert run.pg_transactions == 60


def test_the_commands_run_most_come_first_per_call() -> None:
    counts = EngineCounts({"get": 10, "incrby": 40, "publish": 20}, pg_transactions=0)
    assert counts.top_redis(calls=10, n=2) == "incrby 4.0, publish 2.0"


def test_the_load_generator_counts_itself_not_the_hub_it_started() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = os.getpid()
        sample = CpuSample({"load generator": {me}, "hub": {me}})
        assert sample._pids("load generator", {me}) == {me}
        assert {me, child.pid} <= sample._pids("hub", {me})  # a hub kind counts its whole process tree
    finally:
        child.kill()
        child.wait()
    assert {"engines", "load generator", "MCP server"} == NOT_THE_HUB
