"""The web process's ASGI handler: each request's sync code runs on one thread, taken from a pool.

Django's own handler made a thread per request (and another to shut it down); these tests fail on it: its
threads are never used twice.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from channels.testing import HttpCommunicator
from django.core.signals import request_finished, request_started

from elicit_hub.asgi import application, django_asgi_app
from elicit_hub.handler import ExecutorPool

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]

HOST = "testserver"
PATH = "/accounts/login/"  # the sign-in page: the whole middleware chain, a view, a template


@pytest.fixture
def threads_seen() -> Iterator[list[tuple[str, str]]]:
    """(signal, thread name) for every request_started and request_finished, as the handler sends them."""
    seen: list[tuple[str, str]] = []

    def started(**kwargs: object) -> None:
        seen.append(("started", threading.current_thread().name))

    def finished(**kwargs: object) -> None:
        seen.append(("finished", threading.current_thread().name))

    request_started.connect(started, weak=False)
    request_finished.connect(finished, weak=False)
    try:
        yield seen
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)


async def get(path: str = PATH) -> int:
    request = HttpCommunicator(application, "GET", path, headers=[(b"host", HOST.encode())])
    response = await request.get_response(timeout=20)
    await request.wait(timeout=20)  # the handler is done: the response closed, request_finished sent
    return int(response["status"])


def test_requests_one_after_another_reuse_one_thread(threads_seen: list[tuple[str, str]]) -> None:
    async def main() -> list[int]:
        return [await get() for _ in range(5)]

    assert asyncio.run(main()) == [200] * 5
    names = {name for _, name in threads_seen}
    assert len(threads_seen) == 10
    assert len(names) == 1, names  # Django's handler: ten names, a new thread for each request
    assert next(iter(names)).startswith("request-")


def test_concurrent_requests_each_have_their_own_thread(threads_seen: list[tuple[str, str]]) -> None:
    """Two requests at once: the first one's sync code waits until the second one's runs, which it can
    only do on another thread; each request starts and finishes on its own."""
    both = threading.Barrier(2, timeout=10)

    def meet(**kwargs: object) -> None:
        both.wait()  # BrokenBarrierError (a 500) if the two shared a thread

    request_started.connect(meet, weak=False)
    try:

        async def main() -> list[int]:
            return list(await asyncio.gather(get(), get()))

        assert asyncio.run(main()) == [200, 200]
    finally:
        request_started.disconnect(meet)
    started = [name for signal, name in threads_seen if signal == "started"]
    finished = [name for signal, name in threads_seen if signal == "finished"]
    assert len(set(started)) == 2
    assert set(finished) == set(started)


def test_the_pool_keeps_the_threads_it_lent() -> None:
    pool = django_asgi_app.threads

    async def main() -> None:
        for _ in range(4):
            await get()

    asyncio.run(main())  # one thread at least is idle in the pool now
    made = pool.made
    asyncio.run(main())
    assert pool.made == made  # the next requests made no thread: each took the idle one
    assert pool.idle >= 1


# --- the pool alone -------------------------------------------------------------------------------------


def test_a_released_executor_is_lent_again() -> None:
    pool = ExecutorPool(idle_max=4)
    first = pool.acquire()
    pool.release(first)
    assert pool.acquire() is first
    assert pool.made == 1


def test_executors_lent_at_once_are_distinct_and_none_is_waited_for() -> None:
    pool = ExecutorPool(idle_max=4)
    lent = [pool.acquire() for _ in range(10)]
    assert len({id(executor) for executor in lent}) == 10
    assert pool.made == 10


def test_past_idle_max_a_released_executor_is_shut_down() -> None:
    pool = ExecutorPool(idle_max=2)
    lent = [pool.acquire() for _ in range(3)]
    threads = [executor.submit(threading.current_thread).result(timeout=5) for executor in lent]
    for executor in lent:
        pool.release(executor)
    assert pool.idle == 2
    threads[2].join(timeout=5)
    assert not threads[2].is_alive()  # the third one's thread ended
    assert all(thread.is_alive() for thread in threads[:2])
    for executor in lent[:2]:
        executor.shutdown()


def test_work_queued_before_a_shutdown_still_runs() -> None:
    pool = ExecutorPool(idle_max=0)
    executor = pool.acquire()
    gate = threading.Event()
    done = executor.submit(lambda: gate.wait(5) and "ran")
    pool.release(executor)  # shut down without waiting: the loop is never blocked by a release
    gate.set()
    assert done.result(timeout=5) == "ran"
