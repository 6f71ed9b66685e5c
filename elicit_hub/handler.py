"""Django's ASGI handler, with each request's thread taken from a pool instead of made for it.

Under ASGI, Django runs a request's synchronous code (sync middleware and views, the ORM, the
``request_started`` and ``request_finished`` receivers) on one thread of its own: ``ASGIHandler`` enters a
``ThreadSensitiveContext`` per request, asgiref starts a single-thread executor for it at the first
``sync_to_async`` call and, when the request ends, shuts it down from yet another new thread (it may not
block the event loop). So every request started two threads and built a new database wrapper for the
first. Under the load benchmark that was about a sixth of the web process's CPU for a small API request
(``docs/performance.md``, fifth pass).

``HubASGIHandler`` keeps what the per-request context guarantees (all of one request's sync code runs on
one thread, and no other request's runs there meanwhile) and hands the context a single-thread executor
from an :class:`ExecutorPool`, as a threaded WSGI server keeps its threads from request to request. A
request that waits (a long-poll) holds its executor while it waits, as it held its own thread before: the
pool makes a new one when none is free, so no request ever waits for a thread, and keeps at most
``idle_max`` idle ones.

It also runs the middleware chain *and* the view in one hop to that thread, as a WSGI server would. Django's
handler loads the chain in async mode: with a sync-only middleware in it, the chain runs on the thread, but
its bottom (``_get_response_async``) is async, so every request went back to the event loop and out to the
thread again for a sync view, and once more for a template's rendering. Here the chain is loaded in sync
mode (``BaseHandler.get_response``) and called with one ``sync_to_async``. An async view still works: the
chain's bottom runs it with ``async_to_sync``, on the event loop, while the request's thread waits. The API's
long-polls are sync views that hand only their wait to the loop (``approvals.api.endpoints``), so their
token check, rate limit and reads never block the loop.

And the request's other two hops are folded into that one. Django's handler sends ``request_started`` in a
hop of its own before the chain, and closes the response (which sends ``request_finished``: the database
connection goes back to the pool) in another after sending it. A response that is not streamed holds its
whole body in memory once the chain returns, so closing it before it is sent changes nothing the client
sees; the three hops become one. A streamed response (a file, an event stream) is still closed after its
last chunk, as Django does.

A client that leaves before its response is sent (an agent whose read timeout is shorter than its long-poll's
``wait``) cancels the response, as under Django's handler, but the view goes on on its thread until it
returns: no thread can be stopped. The handler returns at once, and the request's executor goes back to the
pool only once that work is done (``ExecutorPool.release_when_done``). Django's handler instead waited on
that thread to send ``request_finished`` until the server cancelled it (Daphne does, 10 s after the client
left), and the executor then went back to the pool still busy: the next request queued behind the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpRequest, HttpResponseBase
from django.urls import set_script_prefix

IDLE_MAX = 64


class ExecutorPool:
    """Single-thread executors lent one at a time. ``acquire`` never waits: it makes one when none is idle.
    ``release`` keeps it for the next request, or shuts it down (without waiting) past ``idle_max`` idle."""

    def __init__(self, idle_max: int = IDLE_MAX, name: str = "request") -> None:
        self.idle_max = idle_max
        self.name = name
        self._idle: list[ThreadPoolExecutor] = []
        self._made = 0
        self._lock = threading.Lock()

    def acquire(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self._made += 1
            number = self._made
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-{number}")

    def release(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._idle) < self.idle_max:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)  # its thread ends once the work queued on it (if any) is done

    def release_when_done(self, executor: ThreadPoolExecutor, then: Callable[[], None] | None = None) -> None:
        """``release`` once the work queued on `executor` now is done, running `then` there first: a request
        whose client left may still run there (a long-poll waits out its wait), and the next request must not
        queue behind it."""
        executor.submit(then or _nothing).add_done_callback(lambda _: self.release(executor))

    def idle_executors(self) -> list[ThreadPoolExecutor]:
        """The executors waiting for a request now (a copy: lending goes on meanwhile)."""
        with self._lock:
            return list(self._idle)

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def made(self) -> int:
        return self._made


def _nothing() -> None:
    return None


class HubASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose requests run their sync code on a pooled thread (see the module's notes)."""

    def __init__(self, pool: ExecutorPool | None = None) -> None:
        super().__init__()
        self.threads = pool or ExecutorPool()

    def load_middleware(self, is_async: bool = False) -> None:
        # Sync mode whatever the caller asks: the chain, the view and its rendering are one sync call.
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        """The whole chain in one hop to the request's thread, for a caller of Django's async API: the
        handler's own requests go through `_serve`. (The chain is loaded in sync mode, so Django's own
        ``get_response_async`` would fail here.)"""
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    def _serve(self, scope: dict[str, Any], request: HttpRequest | None, error: Any) -> HttpResponseBase:
        """A request's whole sync part, on its thread: ``request_started``, the chain (or the error response
        ``create_request`` made), and the response's close when it is not streamed."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        try:
            response: HttpResponseBase = error if request is None else self.get_response(request)
        except BaseException:  # not an Exception (the chain turns those into responses): a cancellation
            signals.request_finished.send(sender=self.__class__)
            raise
        response._handler_class = self.__class__  # type: ignore[attr-defined]  # the sender of its close
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size  # as run_get_response: the server chunks the body
        if not response.streaming:
            response.close()
        return response

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        leftover = await self._handle(scope, receive, send)
        if leftover is not None:
            await sync_to_async(leftover)()

    async def _handle(self, scope: dict[str, Any], receive: Any, send: Any) -> Callable[[], None] | None:
        """``ASGIHandler.handle`` with one hop to the request's thread instead of three (module notes). None
        when the request's sync code is done. When its client left before the response was sent, the view
        may still run on the request's thread (it closes its own response when it returns): what to run
        there after it (closing the request's body, which the view may still read)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return None
        set_script_prefix(get_script_prefix(scope))
        request, error = self.create_request(scope, body_file)

        async def process_request() -> HttpResponseBase:
            response = await sync_to_async(self._serve, thread_sensitive=True)(scope, request, error)
            with contextlib.suppress(asyncio.CancelledError):  # the client left while it was being sent
                await self.send_response(response, send)
            return response

        # As Django does: a client that disconnects before its response is sent cancels the response.
        listening = asyncio.create_task(self.listen_for_disconnect(receive))
        serving = asyncio.create_task(process_request())
        await asyncio.wait([listening, serving], return_when=asyncio.FIRST_COMPLETED)
        for task in (listening, serving):
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = serving.result()
        except asyncio.CancelledError:
            # Its thread may still be running the chain. Once it is done there, request_finished (as Django's
            # handler sends it here, on the same thread, which waited for the view; a response not streamed
            # has sent it already, and a second changes nothing) and the body's close.
            def leftover() -> None:
                signals.request_finished.send(sender=self.__class__)
                body_file.close()

            return leftover
        if response.streaming:
            await sync_to_async(response.close)()
        body_file.close()
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.acquire()
        # Until the request is handled (and if it raises), its thread may still be busy with it.
        leftover: Callable[[], None] | None = _nothing
        try:
            async with ThreadSensitiveContext(executor=executor):
                leftover = await self._handle(scope, receive, send)
        finally:
            if leftover is None:
                self.threads.release(executor)
            else:  # lent again once the work queued on it is done
                self.threads.release_when_done(executor, leftover)
