"""The only module that talks to the channel layer. Services call it from ``transaction.on_commit``.

Groups: ``call.<id>`` (long-polls and call pages waiting on one call) and ``team.<slug>`` /
``team._unrouted`` (reviewers' queues). Payloads are TypedDicts with a literal ``type``.

Every payload carries its group and a per-group sequence number (a Redis counter through the cache).
A consumer that sees a number other than the last one plus one has missed something (a full channel,
a Redis restart that also reset the counter) and tells its browser to resync from the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import secrets
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Literal, NotRequired, Protocol, TypedDict, cast

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from redis import asyncio as aioredis

from approvals.models import InputRequest, ToolCall
from approvals.redis_cache import RedisCache

logger = logging.getLogger(__name__)

UNROUTED = "_unrouted"


class CallChanged(TypedDict):
    type: Literal["call.changed"]
    call: str
    status: str
    group: str
    seq: int | None


class QueueChanged(TypedDict):
    type: Literal["queue.changed"]
    event: str  # round.opened | input.answered | round.closed
    call: str
    input_requests: list[str]
    round: int | None  # the round holding them, when they share one (the card is then read without a lookup)
    group: str
    seq: int | None
    card: NotRequired[dict[str, Any]]  # a round that opened: its card, rendered once (approvals.cards)


class PresenceChanged(TypedDict):
    type: Literal["presence.changed"]
    input_request: str
    viewers: list[str]
    group: str
    seq: int | None


def call_group(call_id: object) -> str:
    return f"call.{call_id}"


def team_group(team_slug: str | None) -> str:
    return f"team.{team_slug or UNROUTED}"


def _seq_key(group: str) -> str:
    return f"broadcast-seq:{group}"


def next_seq(group: str) -> int | None:
    """The next number of `group`'s sequence (one INCR; a counter Redis lost starts again at 1); None when
    the counter is unreachable."""
    try:
        return cast(RedisCache, cache).count(_seq_key(group))
    except Exception:
        logger.exception("sequence counter for %s unavailable", group)
        return None


COUNTER_CONNECTIONS = 8
_counter_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
    weakref.WeakKeyDictionary()
)


def _counter_client() -> aioredis.Redis:
    """An asyncio Redis client on the cache's Redis, one per event loop (one per web process)."""
    loop = asyncio.get_running_loop()
    client = _counter_clients.get(loop)
    if client is None:
        config: dict[str, Any] = settings.CACHES["default"]
        options: dict[str, Any] = config.get("OPTIONS", {})
        # A bounded pool that waits for a free connection: a thousand sockets pinging at once would
        # otherwise open a connection each, up to the pool's limit, and then fail.
        pool = aioredis.BlockingConnectionPool.from_url(
            str(config["LOCATION"]),
            max_connections=COUNTER_CONNECTIONS,
            timeout=options.get("socket_timeout"),
            socket_timeout=options.get("socket_timeout"),
            socket_connect_timeout=options.get("socket_connect_timeout"),
        )
        client = _counter_clients[loop] = aioredis.Redis(connection_pool=pool)
    return client


_recent: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, tuple[int, float]]] = (
    weakref.WeakKeyDictionary()
)


async def acurrent_seqs(groups: Iterable[str], max_age: float = 0.0) -> dict[str, int]:
    """The groups' counters, in one MGET on the event loop (the cache's async API would take a thread hop
    per key). With ``max_age``, a value this process read at most that many seconds ago is used again: a
    thousand open tabs pinging every few seconds then cost about one read per group per ``max_age``."""
    groups = list(groups)
    loop = asyncio.get_running_loop()
    recent = _recent.setdefault(loop, {})
    now = loop.time()
    found: dict[str, int] = {}
    if max_age > 0:
        for group in groups:
            seq, read_at = recent.get(group, (0, -math.inf))
            if now - read_at <= max_age:
                found[group] = seq
    missing = [group for group in groups if group not in found]
    if missing:
        # The cache's own key names; it stores integers as plain numbers, which INCR keeps.
        values = await _counter_client().mget([cache.make_key(_seq_key(group)) for group in missing])
        for group, raw in zip(missing, values, strict=True):
            found[group] = int(raw or 0)
            recent[group] = (found[group], now)
        if len(recent) > 10_000:  # groups of calls no longer watched
            recent.clear()
    return found


_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def _run(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a channel-layer call on this process's own long-lived event loop.

    Services broadcast from sync code (Celery workers, sync views). ``async_to_sync`` would build a new event
    loop per call, and channels-redis a new Redis connection per loop: ~20 ms per notice. One loop per
    process (made again after a fork) keeps the connections.
    """
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            _loop = asyncio.new_event_loop()
            _loop_pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="broadcast", daemon=True).start()
    asyncio.run_coroutine_threadsafe(coroutine, _loop).result(timeout=10)


def _send(group: str, message: CallChanged | QueueChanged | PresenceChanged) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        message["seq"] = next_seq(group)
        _run(layer.group_send(group, dict(message)))
    except Exception:
        # A lost notice is recovered by the clients' resync; it must never undo the committed change.
        logger.exception("broadcast to %s failed", group)


def call_changed(call: ToolCall) -> None:
    group = call_group(call.pk)
    _send(
        group, CallChanged(type="call.changed", call=str(call.pk), status=call.status, group=group, seq=None)
    )


def _groups_of(ir: InputRequest) -> set[str | None]:
    """The team slugs whose queues show this request: its team, and the fallback team once escalated."""
    teams: set[str | None] = {ir.team.slug if ir.team else None}
    if ir.escalation_team is not None:
        teams.add(ir.escalation_team.slug)
    return teams


def queue_changed(
    event: str, call_id: object, input_requests: list[InputRequest], card: dict[str, Any] | None = None
) -> None:
    """Tell the queues of the requests' teams. ``card``: the card of the round holding them, rendered for the
    notice (``approvals.cards.prerender``); every team's notice carries it."""
    teams = set().union(*(_groups_of(ir) for ir in input_requests)) if input_requests else set()
    rounds = {ir.round_id for ir in input_requests}
    round_id = rounds.pop() if len(rounds) == 1 else None
    for team in teams:
        ids = [str(ir.pk) for ir in input_requests if team in _groups_of(ir)]
        group = team_group(team)
        message = QueueChanged(
            type="queue.changed",
            event=event,
            call=str(call_id),
            input_requests=ids,
            round=round_id,
            group=group,
            seq=None,
        )
        if card is not None and round_id is not None:
            message["card"] = card
        _send(group, message)


def input_escalated(ir: InputRequest) -> None:
    queue_changed("round.opened", ir.round.call_id, [ir])


def presence_changed(input_request: InputRequest, viewers: list[str]) -> None:
    for team in _groups_of(input_request):
        group = team_group(team)
        _send(
            group,
            PresenceChanged(
                type="presence.changed",
                input_request=str(input_request.pk),
                viewers=viewers,
                group=group,
                seq=None,
            ),
        )


async def subscribe(channel: str, groups: Iterable[str]) -> None:
    """Add a consumer's channel to groups (safe to repeat: it renews the membership)."""
    layer = get_channel_layer()
    for group in groups:
        await layer.group_add(group, channel)


async def unsubscribe(channel: str, groups: Iterable[str]) -> None:
    layer = get_channel_layer()
    for group in groups:
        with contextlib.suppress(Exception):  # leaving during a Redis outage must not raise
            await layer.group_discard(group, channel)


# A test of a channel-layer notice: does it concern what a long-poll waits for?
Wanted = Callable[[dict[str, Any]], bool]


class _Waiters:
    """Every long-poll of one event loop (one web process) waits on one channel-layer channel.

    One receive loop per process reads that channel for good and wakes the long-polls waiting on the group
    a notice was sent to (``call.<id>`` for a call's long-poll, ``team.<slug>`` for the inbox's); the channel
    joins a group while anyone waits on it. A receive per long-poll, cancelled every few seconds, hangs other
    receivers of the same channel layer (channels-redis serialises receives behind one lock) and costs a
    BRPOP each.
    """

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.channel = ""
        # group -> the events of the long-polls waiting on it, each with the test a notice must pass to wake
        self.waiters: dict[str, dict[asyncio.Event, Wanted | None]] = {}
        self.lock = asyncio.Lock()
        self.task: asyncio.Task[None] | None = None

    async def add(self, group: str, event: asyncio.Event, wanted: Wanted | None = None) -> None:
        async with self.lock:
            if not self.channel:
                self.channel = await self.layer.new_channel()
            if self.task is None or self.task.done():
                self.task = asyncio.get_running_loop().create_task(self._receive())
            if group not in self.waiters:
                await self.layer.group_add(group, self.channel)
                self.waiters[group] = {}
            self.waiters[group][event] = wanted

    async def remove(self, group: str, event: asyncio.Event) -> None:
        async with self.lock:
            events = self.waiters.get(group)
            if events is None:
                return
            events.pop(event, None)
            if not events:
                del self.waiters[group]
                with contextlib.suppress(Exception):
                    await self.layer.group_discard(group, self.channel)

    async def _receive(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("long-poll listener: channel layer unavailable; long-polls poll meanwhile")
                await asyncio.sleep(1.0)
                continue
            for event, wanted in list(self.waiters.get(str(message.get("group")), {}).items()):
                if wanted is None or wanted(message):
                    event.set()


_waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waiters] = weakref.WeakKeyDictionary()


def _loop_waiters() -> _Waiters:
    loop = asyncio.get_running_loop()
    waiters = _waiters.get(loop)
    if waiters is None:
        waiters = _waiters[loop] = _Waiters(get_channel_layer())
    return waiters


class Finishable(Protocol):
    @property
    def is_final(self) -> bool: ...


async def wait_until_final(
    call_id: object, seconds: float, load: Callable[[], Awaitable[Finishable]]
) -> None:
    """Return once the call is final or ``seconds`` have passed, woken by ``call.changed`` notices.

    The call is re-read every few seconds as well, so a notice lost in transit costs latency, not correctness;
    while the channel layer is unavailable (Redis down) the wait goes on by re-reading every second.
    """

    async def final() -> bool:
        return (await load()).is_final

    # A notice of a status that is not final cannot end the wait: it wakes nothing (and reads nothing).
    await wait_until([call_group(call_id)], seconds, final, wanted=_final_notice)


def _final_notice(message: dict[str, Any]) -> bool:
    """False only for a call's notice naming a status that is not final. Every change to a final status
    sends a notice naming it (`call_finish`); any other notice wakes the wait, which then reads the call."""
    return message.get("type") != "call.changed" or message.get("status") not in ToolCall.Status.opens()


async def wait_until(
    groups: Iterable[str],
    seconds: float,
    done: Callable[[], Awaitable[bool]],
    *,
    wanted: Wanted | None = None,
) -> None:
    """Return once ``done()`` is true or ``seconds`` have passed; ``done`` is asked again whenever a notice
    reaches one of ``groups`` (one that passes ``wanted``, when given), and every few seconds besides, so a
    notice lost in transit costs latency, not correctness. While the channel layer is unavailable (Redis
    down) it is asked every second."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    waiters = _loop_waiters()
    groups, woken = list(groups), asyncio.Event()
    joined: list[str] = []
    interval = 5.0
    try:
        for group in groups:
            await waiters.add(group, woken, wanted)
            joined.append(group)
    except Exception:
        logger.warning("long-poll on %s falls back to polling: channel layer unavailable", ", ".join(groups))
        interval = 1.0
    try:
        while True:
            woken.clear()
            if await done():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=min(remaining, interval))
    finally:
        for group in joined:
            await waiters.remove(group, woken)


# Any change to who answers for which team moves this counter, by a random step: a socket's permission scope
# read at one value is still right while the counter shows that value (a counter Redis lost, counting again,
# never comes back to a value a socket holds). A pseudo-group: no channel ever joins it.
SCOPES = "_scopes"


def scopes_changed() -> None:
    """Someone's teams changed (a membership made, changed or removed): every socket's scope is read again."""
    try:
        cast(RedisCache, cache).count(_seq_key(SCOPES), step=secrets.randbelow(2**31) + 1)
    except Exception:
        # Sockets then notice within their scope's longest life (consumers.SCOPE_MAX_AGE).
        logger.exception("the scopes' counter could not be moved: Redis unavailable")


def scopes_version() -> int | None:
    """The scopes' counter now (0 before any change), or None while Redis is unreachable. Read it before
    reading a scope: a change committed after the read moves it."""
    try:
        return int(cache.get(_seq_key(SCOPES)) or 0)
    except Exception:
        return None


async def ascopes_version(max_age: float = 0.0) -> int:
    """``scopes_version`` on the event loop, read at most once per ``max_age`` seconds by this process;
    raises while Redis is unreachable."""
    return (await acurrent_seqs([SCOPES], max_age=max_age))[SCOPES]


def _version_of(groups: list[str], seqs: dict[str, int]) -> str:
    raw = ",".join(f"{group}={seqs.get(group, 0)}" for group in groups)
    return hashlib.blake2b(raw.encode(), digest_size=12).hexdigest()


def queue_version(groups: Iterable[str]) -> str | None:
    """A short token that changes whenever a notice reaches one of the queues ``groups`` (their sequence
    numbers, hashed); None while the counters are unreachable."""
    groups = sorted(groups)
    keys = {_seq_key(group): group for group in groups}
    try:
        found = cache.get_many(list(keys))
    except Exception:
        logger.warning("queue version unavailable: Redis unreachable")
        return None
    return _version_of(groups, {keys[key]: int(value) for key, value in found.items()})


async def aqueue_version(groups: Iterable[str]) -> str | None:
    """``queue_version`` on the event loop (one MGET, no thread hop)."""
    groups = sorted(groups)
    try:
        seqs = await acurrent_seqs(groups)
    except Exception:
        logger.warning("queue version unavailable: Redis unreachable")
        return None
    return _version_of(groups, seqs)
