"""The event loop synchronous callers' MCP operations run on (`approvals.mcp_client.loop`).

A process's main thread (a Celery worker's child) keeps one loop for all its sends; each run still ends as
``anyio.run`` ends one: nothing it started runs on, and a run cut from outside (a soft time limit) leaves no
loop behind for the next. Sends here are real, to the SDK-built test server of `test_mcp_client`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

from approvals.mcp_client import Completed, call_tool, run
from approvals.mcp_client import loop as mcp_loop
from tests.test_mcp_client import LiveServer, _start

T = TypeVar("T")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    proc, live = _start([])
    try:
        yield live
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _on_loop(awaitable: Awaitable[T], seen: list[asyncio.AbstractEventLoop]) -> T:
    seen.append(asyncio.get_running_loop())
    return await awaitable


def test_sends_from_the_main_thread_share_one_loop(server: LiveServer) -> None:
    seen: list[asyncio.AbstractEventLoop] = []
    for i in range(3):
        outcome = run(_on_loop(call_tool(server.config(), "echo", {"text": f"hi {i}"}), seen))
        assert isinstance(outcome, Completed)
        assert outcome.result["content"] == [{"type": "text", "text": f"echo: hi {i}"}]
    assert seen[0] is seen[1] is seen[2]
    assert seen[0] is mcp_loop.kept_loop()
    assert not seen[0].is_closed()
    # Nothing of the sends (the SDK's task groups, the HTTP client's) is left on it.
    assert asyncio.all_tasks(seen[0]) == set()


def test_another_thread_sends_on_a_loop_of_its_own(server: LiveServer) -> None:
    kept = mcp_loop.kept_loop()
    seen: list[asyncio.AbstractEventLoop] = []
    outcomes: list[Any] = []

    def send() -> None:
        for i in range(2):
            outcomes.append(run(_on_loop(call_tool(server.config(), "echo", {"text": f"t{i}"}), seen)))

    thread = threading.Thread(target=send)
    thread.start()
    thread.join(timeout=30)
    assert [type(outcome) for outcome in outcomes] == [Completed, Completed]
    assert kept not in seen
    assert seen[0] is not seen[1]  # each run its own loop, closed when it ends
    assert seen[0].is_closed() and seen[1].is_closed()
    assert mcp_loop.kept_loop() is kept


def test_what_a_run_started_and_left_running_is_cancelled_before_it_returns() -> None:
    events: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(30)
            events.append("ran on")
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    async def operation() -> str:
        asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0)
        return "done"

    assert run(operation()) == "done"
    assert events == ["cancelled"]
    assert asyncio.all_tasks(mcp_loop.kept_loop()) == set()


def test_a_failed_run_leaves_the_loop_usable_and_empty() -> None:
    async def failing() -> None:
        asyncio.get_running_loop().create_task(asyncio.sleep(30))
        raise ValueError("the operation's own failure")

    before = mcp_loop.kept_loop()
    with pytest.raises(ValueError, match="own failure"):
        run(failing())
    assert mcp_loop.kept_loop() is before
    assert asyncio.all_tasks(before) == set()

    async def fine() -> int:
        return 7

    assert run(fine()) == 7


class Cut(Exception):
    """What a Celery soft time limit raises: from a signal handler, wherever the main thread is."""


def test_a_run_cut_from_outside_leaves_no_loop_behind() -> None:
    events: list[str] = []

    async def waits(name: str) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append(f"{name} cancelled")
            raise

    async def operation() -> None:
        asyncio.get_running_loop().create_task(waits("background"))
        await waits("operation")

    def cut(signum: int, frame: Any) -> None:
        raise Cut("soft time limit")

    before = mcp_loop.kept_loop()
    previous = signal.signal(signal.SIGALRM, cut)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Cut):
            run(operation())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # Whatever the cut interrupted was cancelled, not left to resume in the next run...
    assert sorted(events) == ["background cancelled", "operation cancelled"]
    assert before.is_closed()

    # ...which runs on a new loop.
    async def fine() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    after = run(fine())
    assert after is not before
    assert after is mcp_loop.kept_loop()


def test_a_forked_child_never_runs_its_parents_loop() -> None:
    async def which() -> int:
        return id(asyncio.get_running_loop())

    parent = run(which())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, leave at once
        try:
            child = run(which())
            os.write(write, f"{child} {id(mcp_loop.kept_loop())}".encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 100).decode().split()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert len(answer) == 2
    child_loop, child_kept = (int(value) for value in answer)
    assert child_loop == child_kept
    # The parent's loop object exists in the child too (same address): the child must have made a new one.
    assert child_loop != parent
    assert run(which()) == parent
