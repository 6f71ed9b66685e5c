"""`python -m approvals.demo` as a new user runs it: a port already taken or an unusable setting ends it
with one line saying what is wrong, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.demo_support import ROOT


def run_demo(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "approvals.demo", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_port_in_use_is_named_in_one_line(demo: Any) -> None:
    taken = run_demo("--host", "127.0.0.1", "--port", str(demo.port))

    assert taken.returncode == 1
    assert "Traceback" not in taken.stderr
    assert taken.stderr.strip() == (
        f"python -m approvals.demo: cannot listen on 127.0.0.1 port {demo.port}: Address already in use"
    )


@pytest.mark.parametrize("ttl", ["ten minutes", "0"])
def test_an_unusable_state_ttl_is_named_in_one_line(ttl: str) -> None:
    refused = run_demo("--port", "0", ELICIT_DEMO_STATE_TTL=ttl)

    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip() == (
        f"python -m approvals.demo: ELICIT_DEMO_STATE_TTL must be a positive number of seconds, not {ttl!r}"
    )
