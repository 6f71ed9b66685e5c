"""The web process's ASGI handler: each request's sync code runs on one thread, taken from a pool, and
``request_started``, the middleware chain, the view and the response's close run there in one hop from the
event loop (a streamed response is closed after its last chunk).

Django's own handler made a thread per request (and another to shut it down); these tests fail on it: its
threads are never used twice. It also ran the view apart from the chain (the chain's bottom was async), so
a sync view cost two more hops and a trip back to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import AsyncToSync, SyncToAsync, sync_to_async
from channels.testing import HttpCommunicator
from django.conf import settings
from django.core.signals import request_finished, request_started
from django.test import Client

from approvals import ratelimit
from approvals.models import ToolCall
from elicit_hub.asgi import application, django_asgi_app
from elicit_hub.handler import ExecutorPool
from tests import factories

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


async def get(path: str = PATH, token: str = "") -> int:
    headers = [(b"host", HOST.encode())]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    request = HttpCommunicator(application, "GET", path, headers=headers)
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


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Every hop a request makes: ``to_thread`` (a sync_to_async run: its thread's name), ``to_loop`` (an
    async_to_sync: what it awaits), and ``throttle`` (the thread the API's rate limit ran on)."""
    seen: dict[str, list[str]] = {"to_thread": [], "to_loop": [], "throttle": []}
    thread_handler = SyncToAsync.thread_handler
    to_loop = AsyncToSync.__call__
    allow_request = ratelimit.SlidingWindowMixin.allow_request

    def counted_thread_handler(self: SyncToAsync, *args: object, **kwargs: object) -> object:
        seen["to_thread"].append(threading.current_thread().name)
        return thread_handler(self, *args, **kwargs)

    def counted_to_loop(self: AsyncToSync, *args: object, **kwargs: object) -> object:
        seen["to_loop"].append(getattr(self.awaitable, "__name__", repr(self.awaitable)))
        return to_loop(self, *args, **kwargs)

    def seen_allow_request(self: ratelimit.SlidingWindowMixin, request: object) -> bool:
        seen["throttle"].append(threading.current_thread().name)
        return allow_request(self, request)  # type: ignore[arg-type]

    monkeypatch.setattr(SyncToAsync, "thread_handler", counted_thread_handler)
    monkeypatch.setattr(AsyncToSync, "__call__", counted_to_loop)
    monkeypatch.setattr(ratelimit.SlidingWindowMixin, "allow_request", seen_allow_request)
    return seen


def test_a_page_runs_in_one_hop(hops: dict[str, list[str]]) -> None:
    assert asyncio.run(get()) == 200
    # request_started, the chain with the view and its template, and the response's close (request_finished)
    # in one hop. Django's handler: request_started, then the chain, then the view, then the template's
    # render, then the close, each a hop of its own, and the chain's bottom a trip back to the event loop.
    assert len(hops["to_thread"]) == 1, hops
    assert hops["to_loop"] == []


async def _served(path: str, headers: list[tuple[bytes, bytes]], seen: list[tuple[str, str]]) -> None:
    """Serve one GET, adding what the handler sends the server to `seen`, in order with the signals."""

    async def app(scope: dict[str, object], receive: object, send: Any) -> None:
        async def recorded(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                seen.append(("start", str(message["status"])))
            elif message["type"] == "http.response.body":
                seen.append(("body", "more" if message.get("more_body") else "last"))
            await send(message)

        await django_asgi_app(scope, receive, recorded)

    request = HttpCommunicator(app, "GET", path, headers=[(b"host", HOST.encode()), *headers])
    await request.send_input({"type": "http.request", "body": b""})
    while True:  # not get_response: a streamed response's last message may have no body
        message = await request.receive_output(timeout=20)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            break
    await request.wait(timeout=20)


def test_a_page_is_closed_on_its_thread_before_it_is_sent(threads_seen: list[tuple[str, str]]) -> None:
    asyncio.run(_served(PATH, [], threads_seen))
    signals = [signal for signal, _ in threads_seen]
    assert signals == ["started", "finished", "start", "body"], threads_seen
    assert threads_seen[0][1] == threads_seen[1][1]  # one thread, the request's


def test_a_streamed_response_is_closed_after_its_last_chunk(threads_seen: list[tuple[str, str]]) -> None:
    """The audit export streams: its reads go on while it is sent, so it closes (request_finished gives
    the database connection back) only after its last chunk, as under Django's handler."""
    client = Client()
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    asyncio.run(_served("/audit/export.jsonl", [(b"cookie", cookie.encode())], threads_seen))
    signals = [signal for signal, _ in threads_seen]
    assert signals[:2] == ["started", "start"], threads_seen
    assert signals.count("body") >= 2  # streamed: the header line, then the trailer at least
    assert signals[-2:] == ["body", "finished"], threads_seen
    assert ("body", "last") in threads_seen


def _agent_call(status: str, **extra: object) -> tuple[str, str]:
    server = factories.server("hops")
    agent, token = factories.agent("hops-bot", servers=[server])
    call = factories.call(server, agent, status=status, **extra)
    return token, str(call.pk)


def test_an_agents_call_read_never_runs_on_the_event_loop(hops: dict[str, list[str]]) -> None:
    token, call_id = _agent_call(ToolCall.Status.COMPLETED, result={"content": [], "isError": False})
    assert asyncio.run(get(f"/api/v1/calls/{call_id}", token)) == 200
    # The API view (its token check, its rate limit in Redis, its reads) ran on the request's thread. As an
    # async view it ran on the event loop, its rate limit blocking the loop for a Redis round trip.
    assert hops["to_loop"] == []
    assert hops["throttle"] and all(name.startswith("request-") for name in hops["throttle"]), hops
    assert len(hops["to_thread"]) == 1, hops


@pytest.mark.parametrize("status", [ToolCall.Status.RUNNING, ToolCall.Status.COMPLETED])
def test_only_a_long_polls_wait_runs_on_the_event_loop(
    hops: dict[str, list[str]], status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from approvals.api import endpoints

    token, call_id = _agent_call(status, result={"content": [], "isError": False})
    status_reads: list[str] = []
    read_status = endpoints._own_status_released

    def counted(*args: object) -> ToolCall:
        status_reads.append(threading.current_thread().name)
        return read_status(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(endpoints, "_own_status_released", counted)
    assert asyncio.run(get(f"/api/v1/calls/{call_id}?wait=1", token)) == 200
    assert hops["to_loop"] == ["wait_until_final"]
    assert all(name.startswith("request-") for name in hops["throttle"]), hops
    # The status is read on the request's thread, once the wait listens for the call's notices, and not also
    # before: a call already final costs one read of its status before the whole call is read.
    assert status_reads and all(name.startswith("request-") for name in status_reads), status_reads
    # A call already final: one read. One still running: a read as the wait starts, one as it ends.
    assert len(status_reads) == (1 if status == ToolCall.Status.COMPLETED else 2), status_reads


def test_a_long_poll_its_client_left_holds_up_no_other_request(
    threads_seen: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent whose client gives up on a long-poll (its read timeout shorter than its `wait`) before the
    view has begun to wait: the handler gives the response up at once, while the view goes on into its wait
    on its thread, which is lent again only once the wait is over. Before, the handler waited on that thread
    (Django's request_finished) until the server cancelled it (Daphne does 10 s after the client left; here
    the communicator, after 5 s), and the thread then went back to the pool still waiting: the next request
    (here the sign-in page) queued behind the wait. (A client that leaves once the wait has begun cancels the
    wait itself: asgiref passes the cancellation on.)"""
    token, call_id = _agent_call(ToolCall.Status.RUNNING)
    headers = [(b"host", HOST.encode()), (b"authorization", f"Bearer {token}".encode())]
    left = threading.Event()
    allow_request = ratelimit.SlidingWindowMixin.allow_request

    def once_the_client_left(self: ratelimit.SlidingWindowMixin, request: object) -> bool:
        left.wait(10)  # the view goes on only once its client has left
        return allow_request(self, request)  # type: ignore[arg-type]

    monkeypatch.setattr(ratelimit.SlidingWindowMixin, "allow_request", once_the_client_left)

    async def main() -> int:
        poll = HttpCommunicator(application, "GET", f"/api/v1/calls/{call_id}?wait=15", headers=headers)
        await poll.send_input({"type": "http.request", "body": b""})
        while not threads_seen:  # the long-poll runs on its thread
            await asyncio.sleep(0.01)
        await poll.send_input({"type": "http.disconnect"})
        with contextlib.suppress(asyncio.TimeoutError):
            await poll.wait(timeout=5)  # the handler gives up on the response
        left.set()
        monkeypatch.setattr(ratelimit.SlidingWindowMixin, "allow_request", allow_request)
        try:
            return await asyncio.wait_for(get(), timeout=10)
        finally:
            await sync_to_async(factories.finish_call)(call_id)  # the wait ends; the view closes its request
            for _ in range(500):
                if ("finished", threads_seen[0][1]) in threads_seen:
                    break
                await asyncio.sleep(0.01)

    assert asyncio.run(main()) == 200
    polled = threads_seen[0][1]
    page = [name for signal, name in threads_seen[1:] if signal == "started"]
    assert page and page[0] != polled, threads_seen  # the long-poll's thread was still waiting
    assert ("finished", polled) in threads_seen  # the long-poll's request ended on its own thread


# --- the pool alone -------------------------------------------------------------------------------------


def test_a_released_executor_is_lent_again() -> None:
    pool = ExecutorPool(idle_max=4)
    first = pool.acquire()
    pool.release(first)
    assert pool.acquire() is first
    assert pool.made == 1


def test_an_executor_still_busy_is_lent_again_only_once_its_work_is_done() -> None:
    pool = ExecutorPool(idle_max=4)
    busy = pool.acquire()
    go_on = threading.Event()
    done: list[str] = []
    busy.submit(go_on.wait, 10)
    pool.release_when_done(busy, then=lambda: done.append("then"))
    assert pool.acquire() is not busy  # still waiting: the next request gets another thread
    go_on.set()
    for _ in range(500):
        if pool.idle:
            break
        threading.Event().wait(0.01)
    assert done == ["then"]
    assert pool.acquire() is busy


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
