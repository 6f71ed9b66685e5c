"""The holder process (``manage.py run_holder``): handshake-era sessions kept open while people decide.

One asyncio process holds many calls at once, one task each (no thread per session). It registers a `Holder`
row and heartbeats; claims queued calls whose server needs a session (one conditional UPDATE, so each call is
held by exactly one holder); opens a handshake-era client per call; and answers the server's
``elicitation/create`` on the same session once reviewers have answered the push round it became. It is
woken by PostgreSQL ``NOTIFY`` (new work, an answered round) and polls as well, so a lost notice only delays.

Database work goes through `sync_to_async` on one thread (one connection, bounded); the sessions themselves
only cost memory and a socket while they wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import math
import os
import random
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ParamSpec, TypeVar

import anyio
import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from approvals.mcp_client import McpError, PermanentError
from approvals.mcp_client.session import (
    Dispatcher,
    SessionHooks,
    UrlRequired,
    call_on,
    check_url,
    expect_output,
    http_transport,
    list_tools_on,
    open_client,
)
from approvals.services import holding, servers
from approvals.services.webhooks import retry_wait

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# After the server's announced wait, how long the hub still keeps the round open (clock skew, latency).
DEADLINE_GRACE = 2.0
PROGRESS_EVERY = 1.0  # seconds between stored progress updates of one call
# A question answered ``cancel`` because its call ended: how long the tool has to end on its own before the
# holder stops it (abandons its tools/call, which sends the server notifications/cancelled).
STOP_AFTER_CANCEL = 5.0
# While LISTEN works, a waiting call re-reads its round this rarely (a NOTIFY wakes it at once): hundreds of
# idle sessions must not poll the database every few seconds. Without LISTEN, every ELICIT_HOLDER_POLL.
RECHECK_LISTENING = 30.0
# A call's end that PostgreSQL could not take is written again after this long, doubling up to the most.
RECORD_RETRY_MIN = 1.0
RECORD_RETRY_MAX = 30.0
# What a database that is away raises (restarting, failing over, unreachable): worth trying again.
DATABASE_AWAY = (OperationalError, InterfaceError)
STDIO_MODULE = "approvals.holder.stdio"


def db(fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """Run a service function on the holder's one database thread (on a working connection: see `_fresh`)."""
    return sync_to_async(partial(_fresh, fn), thread_sensitive=True)


def _fresh(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn` as one unit of work, as a request or a Celery task is one: the thread's connection is handed back
    after it (to the pool, whose check lends the next one only once it is known to work), and dropped before
    it if it broke. Kept for good instead, the thread's one connection would break when PostgreSQL restarts
    (a failover, a proxy cutting idle sessions), and every query on it would fail: the holder's claims,
    heartbeats and answers, and the write of a result that arrived then."""
    _hand_back()
    try:
        return fn(*args, **kwargs)
    finally:
        _hand_back()


def _hand_back() -> None:
    """Django's end of a request (``close_old_connections``): a connection past its age (CONN_MAX_AGE 0: any)
    or broken is closed, which gives a pooled one back to its pool. Never inside a transaction."""
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


async def shielded(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """A database write that must finish even while the task around it is being cancelled."""
    with anyio.CancelScope(shield=True):
        result = await db(fn)(*args, **kwargs)
    return result


async def recorded(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """How a call ended (its result, its failure, its release): `shielded`, and written again until PostgreSQL
    takes it (it may be away for a while: a restart, a failover), so a result that arrives meanwhile is not
    lost and the call is not left running with no task on it. Only a lost database connection is retried; the
    holder stopping meanwhile ends the call as a lost holder's (`holding.holder_stop`)."""
    backoff = RECORD_RETRY_MIN
    while True:
        try:
            return await shielded(fn, *args, **kwargs)
        except DATABASE_AWAY as exc:
            logger.warning(
                "could not record %s (%s); trying again in %.0f s", fn.__name__, type(exc).__name__, backoff
            )
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, RECORD_RETRY_MAX)


@dataclass
class _Run:
    """One call on this holder."""

    held: holding.HeldCall
    sent: bool = False
    tools_changed: bool = False
    # Progress: the newest notification not stored yet, the task storing it, when the last was stored.
    progress_due: tuple[float, float | None, str | None] | None = None
    progress_writer: asyncio.Task[None] | None = None
    progress_flush: asyncio.Event = field(default_factory=asyncio.Event)
    last_progress: float = -math.inf
    asking: bool = False  # a question of the server's waits for a person
    refused: int = 0  # questions cancelled because another was waiting


class _NotSent(Exception):
    """The call was cancelled or taken away before tools/call left."""


class _NotHere(Exception):
    """Another holder runs the call's stdio server: give the call back (nothing was sent)."""


class HolderProcess:
    def __init__(
        self,
        *,
        name: str | None = None,
        max_calls: int | None = None,
        poll: float | None = None,
        heartbeat: float | None = None,
    ) -> None:
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.max_calls = max_calls or settings.ELICIT_HOLDER_MAX_CALLS
        self.poll = poll or settings.ELICIT_HOLDER_POLL
        self.heartbeat = heartbeat or settings.ELICIT_HOLDER_HEARTBEAT
        self.holder_id: int | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.waiters: dict[str, asyncio.Event] = {}
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.sessions = 0
        self.lost = False
        self.listening = False
        self.stdio = importlib.util.find_spec(STDIO_MODULE) is not None
        self._supervisors: dict[int, Any] = {}  # stdio servers this holder runs, by server id
        self.asking: set[str] = set()  # calls waiting for a person's answer to the server's question
        # Calls whose server's question is being opened as a round, and those of them found ended meanwhile.
        # The round is committed (a reviewer sees it, an agent may cancel the call) before the holder is back
        # to wait on it: an end found then is left to the round's ``cancel`` (`_elicit`), not a stop at once.
        self.opening: set[str] = set()
        self.ended_while_opening: set[str] = set()
        self.ending: set[str] = set()  # calls whose task this holder cancelled: the call ended meanwhile
        # Calls whose server was just answered ``cancel``: their tool has STOP_AFTER_CANCEL seconds to end.
        self.settling: set[str] = set()
        # Calls whose outcome is recorded while their session is still open (listing the tools the server
        # said changed, being closed): over, but nothing to stop (their tool has ended).
        self.finished: set[str] = set()
        self._checks: set[asyncio.Task[None]] = set()

    # ---- the process -------------------------------------------------------------------------------

    async def run(self) -> None:
        waited = False
        while True:
            try:
                self.holder_id = await db(holding.holder_start)(name=self.name)
                break
            except holding.NameTaken:
                pass
            # Started again under its name (``--name``) while its old row still beats, or looks as if it did
            # (the old process was killed a moment ago): the name is taken over once that row goes stale.
            if not waited:
                logger.warning(
                    "a holder named %s is registered and its heartbeat is recent; waiting for it to stop (or "
                    "for %d s without a heartbeat) before starting",
                    self.name,
                    settings.ELICIT_HOLDER_STALE,
                )
                waited = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=self.poll)
            if self.stopping.is_set():
                return
        logger.info("holder %s running (at most %d calls)", self.name, self.max_calls)
        helpers = [asyncio.create_task(self._listen()), asyncio.create_task(self._beat())]
        try:
            while not self.stopping.is_set():
                try:
                    await self._claim()
                except Exception as exc:
                    # PostgreSQL is away (a restart, a failover): the held sessions go on; claim at the next
                    # poll, rather than end the process and every session it holds.
                    logger.warning("holder %s could not claim calls: %s", self.name, type(exc).__name__)
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._woken(), timeout=self.poll)
        finally:
            for helper in helpers:
                helper.cancel()
            for task in list(self.tasks.values()):
                task.cancel()
            await asyncio.gather(*helpers, *self.tasks.values(), return_exceptions=True)
            # All at once: each may take its server's whole grace (one that ignores SIGTERM), and the holder's
            # own stop must not grow with the number of stdio servers it runs.
            await asyncio.gather(
                *(supervisor.stop() for supervisor in self._supervisors.values()), return_exceptions=True
            )
            if not self.lost:
                ended = await db(holding.holder_stop)(holder_id=self.holder_id)
                logger.info("holder %s stopped; %d held calls ended with it", self.name, ended)

    async def _woken(self) -> None:
        wake = asyncio.create_task(self.wake.wait())
        stop = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait([wake, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            stop.cancel()

    def stop(self) -> None:
        self.stopping.set()

    async def _claim(self) -> None:
        assert self.holder_id is not None
        room = self.max_calls - len(self.tasks)
        if room <= 0:
            return
        for call_id in await db(holding.holder_claim)(holder_id=self.holder_id, limit=room, stdio=self.stdio):
            task = asyncio.create_task(self._run_call(call_id), name=f"call {call_id}")
            self.tasks[call_id] = task
            task.add_done_callback(partial(self._done, call_id))

    def _done(self, call_id: str, task: asyncio.Task[None]) -> None:
        self.tasks.pop(call_id, None)
        self.waiters.pop(call_id, None)
        self.finished.discard(call_id)
        if not task.cancelled() and task.exception() is not None:
            logger.error("call %s: the holder task failed", call_id, exc_info=task.exception())
        self.wake.set()  # room for another call

    async def _beat(self) -> None:
        assert self.holder_id is not None
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                alive = await db(holding.holder_beat)(holder_id=self.holder_id, sessions=self.sessions)
            except Exception:
                logger.exception("holder heartbeat failed")
                continue
            if not alive:
                logger.error("holder %s was declared lost; its calls have ended; stopping", self.name)
                self.lost = True
                self.stop()
                return

    async def _listen(self) -> None:
        """PostgreSQL LISTEN: ``work`` wakes the claim loop, ``call:<id>`` the task waiting on that call."""
        params = dict(connection.get_connection_params())
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {holding.CHANNEL}")
                    self.listening = True
                    # Notices may have been missed while not listening: everyone looks once.
                    self.wake.set()
                    for waiter in self.waiters.values():
                        waiter.set()
                    async for notice in conn.notifies():
                        self._notice(notice.payload)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("holder LISTEN connection failed; polling meanwhile", exc_info=True)
            finally:
                self.listening = False
            await asyncio.sleep(self.poll)

    def _notice(self, payload: str) -> None:
        if payload.startswith("call:"):
            call_id = payload.removeprefix("call:")
            waiter = self.waiters.get(call_id)
            if waiter is not None:
                waiter.set()
            if call_id in self.tasks and call_id not in self.asking and call_id not in self.settling:
                # Not waiting for a person: the call may have ended meanwhile (the agent cancelled it). One
                # whose server was just answered ``cancel`` is checked once its grace has passed, not at
                # the next notice (one cancel sends several: the round's, the call's).
                self._check_ended(call_id)
        else:
            self.wake.set()

    def _check_ended(self, call_id: str, *, after: float = 0.0) -> None:
        """`_stop_if_ended`, in a task of its own, `after` seconds from now."""
        check = asyncio.create_task(self._stop_if_ended(call_id, after=after))
        self._checks.add(check)  # held: a task is weakly referenced
        check.add_done_callback(self._checks.discard)

    async def _stop_if_ended(self, call_id: str, *, after: float = 0.0) -> None:
        """The call ended while its tools/call runs (the agent cancelled it): stop waiting for the result.
        Cancelling the request makes the SDK send the server ``notifications/cancelled`` for it, so the tool
        stops now rather than at its end. A call waiting for a person is not stopped here: the cancelled
        round answers the server ``cancel`` on the same session (`_elicit`) first, and `_elicit` asks
        for this check `STOP_AFTER_CANCEL` seconds later: a tool may go on running once it has that answer."""
        if after > 0:
            try:
                await asyncio.sleep(after)
            finally:
                self.settling.discard(call_id)
        try:
            ended = await db(holding.held_ended)(call_id=call_id)
        except Exception:
            logger.warning("call %s: could not read whether it ended", call_id, exc_info=True)
            return
        task = self.tasks.get(call_id)
        if ended and after == 0 and call_id in self.opening:
            self.ended_while_opening.add(call_id)  # `_elicit` decides once the round is open, or is not
            return
        if ended and task is not None and call_id not in self.asking and call_id not in self.finished:
            self.ending.add(call_id)
            task.cancel()

    # ---- one call ----------------------------------------------------------------------------------

    async def _run_call(self, call_id: str) -> None:
        """Run one held call to its end. A failure nobody expected ends the call too (`holding.held_failed`:
        ``outcome_unknown`` once tools/call was sent), not left running until the holder stops."""
        assert self.holder_id is not None
        try:
            await self._run_held(call_id)
        except Exception as exc:
            logger.exception("call %s: the holder task failed; the call ends", call_id)
            await recorded(
                holding.held_failed, call_id=call_id, holder_id=self.holder_id, why=type(exc).__name__
            )

    async def _run_held(self, call_id: str) -> None:
        assert self.holder_id is not None
        held = await db(holding.held_call)(call_id=call_id, holder_id=self.holder_id)
        if held is None:
            return
        run = _Run(held)
        try:
            await self._run_sessions(run)
        finally:
            if run.progress_writer is not None:
                run.progress_writer.cancel()

    async def _run_sessions(self, run: _Run) -> None:
        assert self.holder_id is not None
        call_id = run.held.call_id
        attempt = 0
        while True:
            try:
                await self._session(run)
            except _NotSent:
                return
            except _NotHere:
                await recorded(
                    holding.held_release, call_id=call_id, holder_id=self.holder_id, reason="run elsewhere"
                )
                return
            except McpError as exc:
                if call_id in self.finished:
                    # The outcome is recorded; the session failed as it was being closed: nothing to tell.
                    logger.warning("call %s: closing its session failed: %s", call_id, exc.code)
                    return
                # Tried again on a new session: a failure before tools/call was sent, or one the server
                # refused it with (its session expired: a 404; a 429), which proves the tool did not run.
                refused = not run.sent or not exc.may_have_run
                if refused and exc.transient and attempt < settings.ELICIT_MCP_MAX_RETRIES:
                    attempt += 1
                    # A server that said when to come back (a 429 or 503 with Retry-After) is not asked
                    # again sooner, up to the cap, as a worker's send waits.
                    wait = retry_wait(
                        settings.ELICIT_MCP_RETRY_BASE * 2 ** (attempt - 1),
                        retry_after=exc.retry_after,
                        cap=settings.ELICIT_MCP_RETRY_MAX,
                    )
                    logger.warning("call %s: %s; retrying in %.1f s", call_id, exc.code, wait)
                    await asyncio.sleep(wait)
                    continue
                await recorded(
                    holding.held_finish,
                    call_id=call_id,
                    error=exc,
                    sent=run.sent,
                    holder_id=self.holder_id,
                )
                return
            except asyncio.CancelledError:
                if call_id in self.ending:  # cancelled by `_stop_if_ended`: the call is over
                    self.ending.discard(call_id)
                    if run.sent:
                        await shielded(holding.held_stopped, call_id=call_id, holder=self.name)
                    return
                if not run.sent:
                    await shielded(
                        holding.held_release,
                        call_id=call_id,
                        holder_id=self.holder_id,
                        reason="holder stopped",
                    )
                raise
            return

    async def _session(self, run: _Run) -> None:
        held = run.held
        if held.transport == "stdio":
            await self._stdio_session(run)
            return
        checked = await check_url(held.config.url)
        dispatcher = Dispatcher()
        # An idle event stream may stay silent for the call's whole limit plus the server's wait for a person.
        read_timeout = held.limit + held.elicitation_wait + 60
        transport, http = http_transport(
            held.config, read_timeout=read_timeout, dispatcher=dispatcher, checked=checked
        )
        with anyio.CancelScope() as closing:
            async with (
                http,
                open_client(
                    transport, mode=held.mode, dispatcher=dispatcher, timeout=held.config.timeout
                ) as client,
            ):
                self.sessions += 1
                try:
                    await self._call(run, client, dispatcher)
                finally:
                    self.sessions -= 1
                # The call's end is recorded. Closing the session sends the server a DELETE, read with the
                # stream's long timeout: one the server never answers must not keep this call's room taken.
                closing.deadline = anyio.current_time() + held.config.timeout

    async def _stdio_session(self, run: _Run) -> None:
        held = run.held
        supervisor = self._supervisors.get(held.server_id)
        if supervisor is None or supervisor.lost:
            module = importlib.import_module(STDIO_MODULE)
            supervisor = module.StdioSupervisor(held.server_id, self.name)
            self._supervisors[held.server_id] = supervisor
        if not await supervisor.start():
            self._supervisors.pop(held.server_id, None)
            raise _NotHere
        async with supervisor.session() as (client, dispatcher):
            self.sessions += 1
            try:
                await self._call(run, client, dispatcher)
            finally:
                self.sessions -= 1

    async def _call(self, run: _Run, client: Any, dispatcher: Dispatcher) -> None:
        """Send the call on the open session and record its outcome (a -32042 refusal: its URL round, and
        the call sent again if that is safe). Raises `McpError` when it failed, `_NotSent` when it ended
        before it was sent."""
        held = run.held
        hooks = SessionHooks(
            elicit=partial(self._elicit, run),
            progress=partial(self._progress, run),
            tools_changed=partial(self._tools_changed, run),
        )
        assert self.holder_id is not None
        # Before the send is recorded: a tools/list this needs, and fails, is not taken for a call that ran.
        await expect_output(client, dispatcher, held.tool, held.definition, timeout=held.config.timeout)
        while True:
            if not await db(holding.held_sending)(call_id=held.call_id, holder_id=self.holder_id):
                raise _NotSent
            run.sent = True
            outcome = await call_on(
                client,
                dispatcher,
                hooks,
                held.tool,
                held.arguments,
                timeout=held.limit,
                idempotency_key=held.idempotency_key,
                tool=held.definition,
            )
            await self._progress_flush(run)  # the last progress lands before the outcome
            if not isinstance(outcome, UrlRequired):
                # Recorded here, on the open session: what follows (listing the tools the server said
                # changed, closing the session, whose DELETE a server may never answer) must neither hold
                # up a result the server already gave nor lose it if the holder stops meanwhile.
                self.finished.add(held.call_id)
                await recorded(
                    holding.held_finish,
                    call_id=held.call_id,
                    outcome=outcome,
                    sent=True,
                    holder_id=self.holder_id,
                )
                if run.tools_changed:
                    await self._relist(run, client)
                return
            if run.tools_changed:
                await self._relist(run, client)
            if not await self._url_round(run, outcome):
                return

    async def _url_round(self, run: _Run, refusal: UrlRequired) -> bool:
        """-32042: the person opens the URL(s). True when the call is then sent again (only if safe)."""
        held = run.held
        opened = await db(holding.push_open)(
            call_id=held.call_id,
            params={"message": refusal.message, "elicitations": refusal.elicitations},
            server_waits=False,
        )
        if opened.round_id is None:
            raise PermanentError("url_elicitation_required", "the server asked for a URL to be opened first")
        if opened.answer is None:
            await self._wait_answer(held.call_id, opened.round_id, deadline=None)
        resend, answers = await db(holding.url_round_done)(round_id=opened.round_id)
        if resend:
            return True
        said = ", ".join(f"{key}: {action}" for key, action in answers.items()) or "no answer"
        error = PermanentError(
            "url_elicitation_required",
            f"The server refused the call until a person opened a URL ({refusal.message}); they answered "
            f"({said}). The tool is not marked safe to repeat, so the hub does not send it again: send the "
            "call again once the URL step is done.",
        )
        await recorded(
            holding.held_finish, call_id=held.call_id, error=error, sent=False, holder_id=self.holder_id
        )
        return False

    async def _elicit(self, run: _Run, params: dict[str, Any]) -> dict[str, Any]:
        """The server's ``elicitation/create``: a push round, answered on this session.

        One at a time (as `holding.push_open` rules): a question that comes while another waits for a person
        is cancelled here (no person saw it: a decline would say one refused), before it costs a transaction
        on the holder's one database thread, so a server asking hundreds at once holds up neither the other
        calls' work nor this holder's heartbeat."""
        held = run.held
        if run.asking:
            run.refused += 1
            if run.refused & (run.refused - 1) == 0:  # the 1st, 2nd, 4th, 8th...: the log stays bounded
                logger.warning(
                    "call %s: an elicitation while another waits for a person; cancelled (%d so far)",
                    held.call_id,
                    run.refused,
                )
            return {"action": "cancel"}
        run.asking = True
        self.opening.add(held.call_id)
        try:
            opened = await db(holding.push_open)(call_id=held.call_id, params=params)
        except BaseException:
            run.asking = False
            raise
        finally:
            self.opening.discard(held.call_id)
            ended = held.call_id in self.ended_while_opening
            self.ended_while_opening.discard(held.call_id)
        if opened.answer is not None or opened.round_id is None:
            run.asking = False
            if ended:  # no person was asked: the tool is stopped now, as it would have been
                self._check_ended(held.call_id)
            return self._answering(held.call_id, opened.answer)
        round_id = opened.round_id
        deadline = anyio.current_time() + held.elicitation_wait + DEADLINE_GRACE
        try:
            answer = await self._wait_answer(held.call_id, round_id, deadline=deadline)
        except BaseException:
            # The server cancelled its request, the session ended, or this holder is stopping: no answer
            # reaches it now, not even one given a moment ago. Its next question may come at once.
            run.asking = False
            await shielded(
                holding.push_gone, round_id=round_id, why="the server stopped waiting", undelivered=True
            )
            raise
        run.asking = False
        if answer is None:
            await shielded(holding.push_gone, round_id=round_id, why="the server's wait for an answer passed")
            # An answer may have won the race with the deadline: it is still what the server gets.
            answer = await db(holding.push_answer)(round_id=round_id)
        return self._answering(held.call_id, answer)

    def _answering(self, call_id: str, answer: dict[str, Any] | None) -> dict[str, Any]:
        """The answer the server gets (``cancel`` when there is none). A ``cancel`` may mean that the call
        ended (the agent cancelled it): its tool is then stopped too if it has not ended a moment later,
        not left to run on the session until the call's limit (on a stdio server, holding it from every
        other call)."""
        if answer is None or answer.get("action") == "cancel":
            self.settling.add(call_id)
            self._check_ended(call_id, after=STOP_AFTER_CANCEL)
        return answer or {"action": "cancel"}

    async def _wait_answer(
        self, call_id: str, round_id: int, *, deadline: float | None
    ) -> dict[str, Any] | None:
        """Wait for the round's answer (a NOTICE, or the poll); None when `deadline` passes first."""
        event = self.waiters.setdefault(call_id, asyncio.Event())
        self.asking.add(call_id)
        try:
            while True:
                event.clear()
                try:
                    answer = await db(holding.push_answer)(round_id=round_id)
                except DATABASE_AWAY as exc:
                    # PostgreSQL is away for a moment: the question still waits on the session (the server
                    # decides how long); read again at the next poll rather than end it.
                    logger.warning("call %s: could not read its answer: %s", call_id, type(exc).__name__)
                    answer, failed = None, True
                else:
                    failed = False
                if answer is not None:
                    return answer
                listened = self.listening and not failed
                wait = RECHECK_LISTENING * random.uniform(0.8, 1.0) if listened else float(self.poll)
                if deadline is not None:
                    remaining = deadline - anyio.current_time()
                    if remaining <= 0:
                        return None
                    wait = min(wait, remaining)
                with anyio.move_on_after(wait):
                    await event.wait()
        finally:
            self.asking.discard(call_id)

    async def _tools_changed(self, run: _Run) -> None:
        run.tools_changed = True  # listed again on this session once the call has its outcome

    async def _relist(self, run: _Run, client: Any) -> None:
        """``notifications/tools/list_changed`` during the call: list the tools on the same session and
        store them (routing rules read their annotations)."""
        run.tools_changed = False
        try:
            tools = await list_tools_on(client, timeout=run.held.config.timeout)
            await db(servers.server_tools_changed)(run.held.server_id, tools=tools, url=run.held.config.url)
        except Exception as exc:
            logger.warning(
                "call %s: listing the changed tools failed: %s", run.held.call_id, type(exc).__name__
            )

    async def _progress(self, run: _Run, progress: float, total: float | None, message: str | None) -> None:
        """A progress notification (the SDK runs each in a task of its own, as they come). Only the newest is
        kept; one task per call stores it at most once per `PROGRESS_EVERY`, whatever the notification says
        (a flood at 100 % as well), and the last one is stored before the outcome (`_progress_flush`)."""
        run.progress_due = (progress, total, message)
        if run.progress_writer is None:
            run.progress_writer = asyncio.create_task(self._progress_write(run))

    async def _progress_write(self, run: _Run) -> None:
        try:
            while run.progress_due is not None:
                wait = run.last_progress + PROGRESS_EVERY - anyio.current_time()
                if wait > 0 and not run.progress_flush.is_set():
                    with anyio.move_on_after(wait):
                        await run.progress_flush.wait()
                (progress, total, message), run.progress_due = run.progress_due, None
                run.last_progress = anyio.current_time()
                try:
                    await db(holding.held_progress)(
                        call_id=run.held.call_id, progress=progress, total=total, message=message
                    )
                except Exception:
                    logger.exception("call %s: could not store progress", run.held.call_id)
        finally:
            run.progress_writer = None

    async def _progress_flush(self, run: _Run) -> None:
        """Store the newest progress now (the call has its outcome), then throttle again."""
        await asyncio.sleep(0)  # notifications that came before the outcome have been taken
        writer = run.progress_writer
        if writer is None:
            return
        run.progress_flush.set()
        try:
            await writer
        finally:
            run.progress_flush.clear()
