"""The only module that talks to the channel layer. Services call it from ``transaction.on_commit``.

Groups: ``call.<id>`` (call pages and long-polls waiting on one call), ``team.<slug>`` /
``team._unrouted`` (reviewers' queues and inbox long-polls) and ``user.<id>`` (the requests made for one
person alone, on that person's queue sockets). Payloads are TypedDicts with a literal ``type``.
Sockets hear a group's notices through the channel layer; long-polls through a wake that each notice also
publishes on Redis, which one subscription per process passes on (`_Wakes`).

Every payload carries its group and a per-group sequence number (a Redis counter through the cache).
A consumer that sees a number other than the last one plus one has missed something (a full channel,
a Redis restart that also reset the counter) and tells its browser to resync from the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import re
import secrets
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Literal, NotRequired, Protocol, TypedDict, TypeGuard, cast

import redis
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from redis import asyncio as aioredis

from approvals.channel_layer import ChannelLayer
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
    event: NotRequired[str]  # ASKED: a round put questions to the agent's own client


# A call's notice that a round passed questions through to the agent's own client (a rule whose requester
# answers): the gateway's wait for the call ends on it, as it does on the call's end.
ASKED = "requester.asked"


class QueueChanged(TypedDict):
    type: Literal["queue.changed"]
    event: str  # round.opened | input.answered | round.closed | round.extended | call.progress
    call: str
    input_requests: list[str]
    round: int | None  # the round holding them, when they share one (the card is then read without a lookup)
    group: str
    seq: int | None
    card: NotRequired[dict[str, Any]]  # a round that opened: its card, rendered once (approvals.cards)
    # The same in every group's copy of one notice (a request's team's, its fallback team's): a socket that
    # hears two of them acts on it once.
    notice: NotRequired[str]


class PresenceChanged(TypedDict):
    type: Literal["presence.changed"]
    input_request: str
    viewers: list[str]
    group: str
    seq: int | None
    notice: NotRequired[str]  # as QueueChanged's


Notice = CallChanged | QueueChanged | PresenceChanged

CALL_GROUPS = "call."


def call_group(call_id: object) -> str:
    return f"{CALL_GROUPS}{call_id}"


def team_group(team_slug: str | None) -> str:
    return f"team.{team_slug or UNROUTED}"


USER_GROUPS = "user."


def user_group(user_id: object) -> str:
    """One person's own queue: the requests made for them alone (their assignee's), whatever their teams."""
    return f"{USER_GROUPS}{user_id}"


# A call's counter lives until CALL_SEQ_TTL seconds after the call's last notice; a team's never expires.
# There is a call group per call ever made, so counters kept for good grew Redis by a key per call. Only a
# socket watching the call reads its counter: one still open after a day without a notice sees the next one
# numbered from 1 again, and resyncs the call as after any counter lost (`consumers._in_sequence`). A team's
# counter also makes its queue's Inbox-Version, which must not come back to a value it had before.
CALL_SEQ_TTL = 24 * 3600


def _seq_key(group: str) -> str:
    return f"broadcast-seq:{group}"


def next_seq(group: str, wake: dict[str, Any] | None = None) -> int | None:
    """The next number of `group`'s sequence (one INCRBY; a counter Redis lost starts again at 1); with
    `wake`, in the same round trip, the wake of every long-poll on the group in any process (a PUBLISH on
    its wake channel, `_Wakes`). A call's counter is given CALL_SEQ_TTL more seconds to live, in the same
    round trip too. None when Redis is unreachable: the notice goes without a number, and the long-polls
    read again within seconds."""
    store = cast(RedisCache, cache)
    try:
        if wake is None and not group.startswith(CALL_GROUPS):
            return store.count(_seq_key(group))
        key = store.make_and_validate_key(_seq_key(group))
        pipe = store._cache.get_client(key, write=True).pipeline(transaction=False)
        _queue_number(pipe, key, group, wake)
        return int(pipe.execute()[0])
    except Exception:
        logger.exception("sequence counter for %s unavailable", group)
        return None


def _queue_number(pipe: redis.client.Pipeline, key: str, group: str, wake: dict[str, Any] | None) -> None:
    """Queue `group`'s next number on `pipe` (its first result), a call's counter's new lease of life, and
    the long-polls' wake."""
    pipe.incrby(key, 1)
    if group.startswith(CALL_GROUPS):
        pipe.expire(key, CALL_SEQ_TTL)
    if wake is not None:
        pipe.publish(wake_channel(group), json.dumps(wake))


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


def _send(group: str, message: Notice) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if _blocking(layer):
            _send_blocking(layer, group, message)
        else:
            message["seq"] = next_seq(group, _wake(group, message))
            _run(layer.group_send(group, dict(message)))
    except Exception:
        # A lost notice is recovered by the clients' resync; it must never undo the committed change.
        logger.exception("broadcast to %s failed", group)


def _blocking(layer: Any) -> TypeGuard[ChannelLayer]:
    """Whether a notice can go from this thread, on the cache's client: the hub's layer, on the one Redis the
    cache is on (as the settings make it)."""
    if not isinstance(layer, ChannelLayer) or layer.ring_size != 1:
        return False
    return bool(layer.hosts[0].get("address") == settings.CACHES["default"]["LOCATION"])


def _send_blocking(layer: ChannelLayer, group: str, message: Notice) -> None:
    """A notice in two round trips, without leaving the sending thread: its number (with the long-polls'
    wake) and the group's members in one pipeline, then the message to them in one script (none when nobody
    listens: a call no page watches). The layer's ``group_send`` from here took a hop to this process's
    broadcast loop and back, and a round trip more."""
    store = cast(RedisCache, cache)
    key = store.make_and_validate_key(_seq_key(group))
    client = store._cache.get_client(key, write=True)
    pipe = client.pipeline(transaction=False)
    _queue_number(pipe, key, group, _wake(group, message))
    layer.queue_members_read(pipe, group)
    results = pipe.execute()
    message["seq"] = int(results[0])
    if results[-1]:
        layer.deliver_blocking(client, results[-1], dict(message), group)


def _wake(group: str, message: Notice) -> dict[str, Any] | None:
    """What the long-polls on `group` are woken with by this notice (its `WAKE_FIELDS`), or None when none
    of them can want it: a call's long-polls wait for its end (`wait_until_final`), so a call's notice of a
    status that is not final (most of a call's notices) wakes nobody and is not published."""
    wake = {field: value for field, value in message.items() if field in WAKE_FIELDS}
    if group.startswith(CALL_GROUPS) and not _final_notice(wake):
        return None
    if group.startswith(USER_GROUPS):
        return None  # only sockets listen to a person's own group
    return wake


def call_changed(call: ToolCall, event: str | None = None) -> None:
    group = call_group(call.pk)
    message = CallChanged(type="call.changed", call=str(call.pk), status=call.status, group=group, seq=None)
    if event is not None:
        message["event"] = event
    _send(group, message)


def _groups_of(ir: InputRequest) -> set[str | None]:
    """The team slugs whose queues show this request: its team, and the fallback team once escalated."""
    teams: set[str | None] = {ir.team.slug if ir.team else None}
    if ir.escalation_team is not None:
        teams.add(ir.escalation_team.slug)
    return teams


def queue_changed(
    event: str, call_id: object, input_requests: list[InputRequest], card: dict[str, Any] | None = None
) -> None:
    """Tell the queues of the requests' teams, and each assignee's own. ``card``: the card of the round
    holding them, rendered for the notice (``approvals.cards.prerender``); every notice carries it."""
    teams = set().union(*(_groups_of(ir) for ir in input_requests)) if input_requests else set()
    rounds = {ir.round_id for ir in input_requests}
    round_id = rounds.pop() if len(rounds) == 1 else None
    notice = secrets.token_hex(8)

    def send(group: str, ids: list[str]) -> None:
        message = QueueChanged(
            type="queue.changed",
            event=event,
            call=str(call_id),
            input_requests=ids,
            round=round_id,
            group=group,
            seq=None,
            notice=notice,
        )
        if card is not None and round_id is not None:
            message["card"] = card
        _send(group, message)

    for team in teams:
        send(team_group(team), [str(ir.pk) for ir in input_requests if team in _groups_of(ir)])
    # A request made for one person reaches them alone, in their own group: they may review for none of
    # the teams above. (Their sockets take it from there only, not from the team's notice.)
    for assignee in {ir.assignee_id for ir in input_requests if ir.assignee_id is not None}:
        send(user_group(assignee), [str(ir.pk) for ir in input_requests if ir.assignee_id == assignee])


def input_escalated(ir: InputRequest) -> None:
    queue_changed("round.opened", ir.round.call_id, [ir])


def presence_changed(input_request: InputRequest, viewers: list[str]) -> None:
    notice = secrets.token_hex(8)
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
                notice=notice,
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


# A test of a notice: does it concern what a long-poll waits for?
Wanted = Callable[[dict[str, Any]], bool]

# What a long-poll's wake carries of its notice: what `Wanted` tests look at.
WAKE_FIELDS = ("type", "status", "event")
# The wakes' subscription is pinged when it has been quiet this long, and given up (and made again) when
# nothing, not even the answer to a ping, came for three times as long.
WAKE_PING_EVERY = 10.0
WAKE_RETRY = 1.0
# A process's first long-poll waits at most this long for the subscription to be made.
WAKE_READY = 1.0


@functools.cache
def _wake_prefix() -> str:
    """The wakes' Redis channels: ``<namespace>:wake:<hash of the Redis URL>:<group>``. Publish/subscribe
    channels are the same in every database of a server; the URL's hash keeps two hubs (or two test runs)
    on one server apart."""
    location = str(settings.CACHES["default"]["LOCATION"])
    return f"{settings.ELICIT_NAMESPACE}:wake:{hashlib.sha256(location.encode()).hexdigest()[:12]}:"


def wake_channel(group: str) -> str:
    return _wake_prefix() + group


@dataclasses.dataclass(eq=False)
class _Waiter:
    """One long-poll, on each group it waits on. A wake that passes `wanted` wakes it to ask again; one that
    also passes `ends` answers it by itself (a call's notice naming a final status: a status the call never
    leaves, published only once it is committed), so the long-poll returns without asking."""

    wanted: Wanted | None = None
    ends: Wanted | None = None
    woken: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    ended: bool = False

    def hear(self, message: dict[str, Any]) -> None:
        if self.wanted is None or self.wanted(message):
            if self.ends is not None and self.ends(message):
                self.ended = True
            self.woken.set()


class _Wakes:
    """Every long-poll of one event loop (one web or API process) is woken through one Redis subscription.

    Each notice is also published on its group's wake channel (`next_seq`, in the round trip that numbers
    it). One task per process subscribes to the pattern of every wake channel for good and wakes the
    long-polls waiting on the group a wake names (``call.<id>`` for a call's long-poll, ``team.<slug>`` for
    the inbox's) whose test it passes. A long-poll costs Redis nothing to start or end, and a notice costs
    each process one pushed message. The long-polls joined the channel layer's groups before: a group
    membership to add and remove per long-poll, and for each notice a message stored per process and a
    receive (a script, a blocking pop, a backup of the message and its removal).

    A wake published while the subscription is down is lost. So every long-poll is woken once the
    subscription is (re)made, to read again, and a long-poll reads every second while it is down.
    """

    def __init__(self) -> None:
        # group -> the long-polls waiting on it
        self.waiters: dict[str, set[_Waiter]] = {}
        self.subscribed = asyncio.Event()
        self.warned = False  # the subscription failed (logged once) and is not made again yet
        self.settled = asyncio.Event()  # the first attempt at the subscription came to an end
        self.task: asyncio.Task[None] | None = None
        self.name = f"{settings.ELICIT_NAMESPACE}-wakes-{os.getpid()}-{id(self):x}"

    def add(self, group: str, waiter: _Waiter) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._listen())
        self.waiters.setdefault(group, set()).add(waiter)

    async def ready(self) -> bool:
        """Whether the subscription is up; while it is being made (a process's first long-poll), after
        waiting for it briefly, so the long-poll's first read comes after any wake it could miss."""
        if not self.subscribed.is_set() and not self.warned:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.settled.wait(), WAKE_READY)
        return self.subscribed.is_set()

    def remove(self, group: str, waiter: _Waiter) -> None:
        waiters = self.waiters.get(group)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self.waiters[group]

    def _wake(self, group: str, message: dict[str, Any]) -> None:
        for waiter in list(self.waiters.get(group, ())):
            waiter.hear(message)

    def _wake_all(self) -> None:
        for waiters in list(self.waiters.values()):
            for waiter in list(waiters):
                waiter.woken.set()

    async def _listen(self) -> None:
        while True:
            try:
                await self._subscribed()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.settled.set()
                if not self.warned:
                    self.warned = True
                    logger.warning("long-poll wakes down (Redis unavailable): long-polls read each second")
                await asyncio.sleep(WAKE_RETRY)

    async def _subscribed(self) -> None:
        """Subscribe, then pass on wakes until the connection fails."""
        config: dict[str, Any] = settings.CACHES["default"]
        timeout = config.get("OPTIONS", {}).get("socket_connect_timeout")
        client = aioredis.Redis.from_url(
            str(config["LOCATION"]),
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            client_name=self.name,  # CLIENT LIST names the process that holds each subscription
        )
        pubsub = client.pubsub()
        try:
            prefix = _wake_prefix()
            await pubsub.psubscribe(re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*")
            loop = asyncio.get_running_loop()
            heard = loop.time()
            while True:
                message = await pubsub.get_message(timeout=WAKE_PING_EVERY)
                now = loop.time()
                if message is None:
                    if now - heard > 3 * WAKE_PING_EVERY:
                        raise ConnectionError("the wakes' subscription went quiet")
                    await pubsub.ping()
                    continue
                heard = now
                kind = message["type"]
                if kind == "psubscribe":
                    self.subscribed.set()
                    self.settled.set()
                    self.warned = False
                    self._wake_all()  # what changed before the subscription took effect is read again
                elif kind == "pmessage":
                    channel = message["channel"]
                    channel = channel.decode() if isinstance(channel, bytes) else str(channel)
                    self._wake(channel.removeprefix(prefix), _wake_of(message["data"]))
        finally:
            self.subscribed.clear()
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            with contextlib.suppress(Exception):
                await client.aclose()


def _wake_of(data: Any) -> dict[str, Any]:
    """A wake's fields; an unreadable one wakes every long-poll on its group (they read to know)."""
    try:
        value = json.loads(data)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


_wakes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Wakes] = weakref.WeakKeyDictionary()


def _loop_wakes() -> _Wakes:
    loop = asyncio.get_running_loop()
    wakes = _wakes.get(loop)
    if wakes is None:
        wakes = _wakes[loop] = _Wakes()
    return wakes


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

    # A notice of a status that is not final cannot end the wait: it wakes nothing (and reads nothing). One
    # naming a final status ends it without a read: the caller reads the whole call next.
    await wait_until([call_group(call_id)], seconds, final, wanted=_final_notice, ends=_names_final)


def _final_notice(message: dict[str, Any]) -> bool:
    """False only for a call's notice naming a status that is not final, unless it tells of questions for
    the agent's own client (`ASKED`: the gateway's wait ends on those too). Every change to a final status
    sends a notice naming it (`call_finish`); any other notice wakes the wait, which then reads the call."""
    return (
        message.get("type") != "call.changed"
        or message.get("status") not in ToolCall.Status.opens()
        or message.get("event") == ASKED
    )


def _names_final(message: dict[str, Any]) -> bool:
    """A call's notice naming a final status: sent after the status is committed, and a call never leaves
    a final status, so the wait is over without reading the call."""
    return message.get("type") == "call.changed" and message.get("status") in ToolCall.Status.finals()


async def wait_until(
    groups: Iterable[str],
    seconds: float,
    done: Callable[[], Awaitable[bool]],
    *,
    wanted: Wanted | None = None,
    ends: Wanted | None = None,
) -> None:
    """Return once ``done()`` is true or ``seconds`` have passed; ``done`` is asked again whenever a notice
    reaches one of ``groups`` (one that passes ``wanted``, when given), and every few seconds besides, so a
    notice lost in transit costs latency, not correctness. A notice that passes ``ends`` as well is taken as
    ``done()``'s answer, without asking. While the wakes' subscription is down (Redis unavailable) ``done``
    is asked every second."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    wakes = _loop_wakes()
    groups, waiter = list(groups), _Waiter(wanted, ends)
    for group in groups:
        wakes.add(group, waiter)
    try:
        await wakes.ready()
        while True:
            waiter.woken.clear()
            if waiter.ended or await done():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            interval = 5.0 if wakes.subscribed.is_set() else 1.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.woken.wait(), timeout=min(remaining, interval))
    finally:
        for group in groups:
            wakes.remove(group, waiter)


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


# The tools agents see through the MCP gateway: a change to any of them (a server's stored tool list written,
# a server added, changed, disabled or removed, an agent's servers or its token changed) moves this counter
# and wakes every gateway process at once (`approvals.gateway.changes`), which then reads what changed and
# tells the clients whose tool list did. A pseudo-group: no channel ever joins it.
TOOLS = "_tools"


def tools_changed() -> None:
    """What agents may see through the gateway may have changed: one INCRBY and one PUBLISH, in one round
    trip. Call it once the change is committed (``transaction.on_commit``). Never raises: while Redis is
    unreachable the gateways still notice within ELICIT_GATEWAY_TOOLS_CHECK seconds."""
    next_seq(TOOLS, {"type": "tools.changed"})
