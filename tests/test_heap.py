"""A serving process settles its heap before it serves (``elicit_hub.heap``): its code is frozen out of the
cyclic collector's way, the first generation's threshold is raised, and cyclic garbage is still collected.

Each check runs in a new Python process: freezing this test run's own heap would keep it for good."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elicit_hub import heap
from tests.live import ROOT, child_env

REPORT = (
    "import gc, sys; "
    "print(gc.get_freeze_count() > 0, gc.get_threshold()[0], 'approvals.api.endpoints' in sys.modules)"
)


def _run(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_settle_freezes_what_is_loaded_and_imports_the_routes_first() -> None:
    before = _run(f"import django; django.setup(); {REPORT}")
    assert before == ["False", "700", "False"]  # CPython's defaults; a view is imported at the first request
    after = _run(
        f"import django; django.setup(); from elicit_hub import heap; heap.settle(routes=True); {REPORT}"
    )
    assert after == ["True", str(heap.GEN0), "True"]


def test_a_cycle_made_after_settling_is_still_collected() -> None:
    code = (
        "import django, gc, weakref; django.setup(); from elicit_hub import heap; heap.settle()\n"
        "class Node: pass\n"
        "node = Node(); node.me = node; ref = weakref.ref(node); del node; gc.collect(); print(ref() is None)"
    )
    assert _run(code) == ["True"]


# Each serving process's entry point, stopped just where it would start serving.
ENTRY_POINTS = {
    # A port it may take (it never listens: stopped before it serves).
    "api (uvicorn)": (
        "import uvicorn; from elicit_hub import serve_api\n"
        f"uvicorn.Server.run = lambda self: exec({REPORT!r})\n"
        "serve_api.main(['--port', '8002'])"
    ),
    "web (Daphne)": (
        "from daphne.cli import CommandLineInterface; from elicit_hub import serve\n"
        f"CommandLineInterface.run = lambda self, argv: exec({REPORT!r})\n"
        "serve.main(['elicit_hub.asgi:application'])"
    ),
    "worker (Celery, before it forks its pool)": (
        "from celery.signals import worker_init; from elicit_hub.celery import app\n"
        "import django; django.setup(); worker_init.send(sender=None)\n"
        f"{REPORT}"
    ),
}


@pytest.mark.parametrize("code", ENTRY_POINTS.values(), ids=ENTRY_POINTS.keys())
def test_each_serving_process_settles_before_it_serves(code: str) -> None:
    frozen, gen0, _ = _run(code)
    assert (frozen, gen0) == ("True", str(heap.GEN0))
