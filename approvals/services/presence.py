"""Who is looking at an input request right now: short-lived entries in Redis, never rows.

A reviewer's page touches its request every few seconds while it is open; an entry nobody renews
lapses after PRESENCE_TTL. Best effort by design: while Redis is unreachable the pages show no viewers.

A reviewer may have the request open in several tabs: each page names itself (``tab``, a random word it
draws when it opens) and its entry is its own, so one tab closing leaves the reviewer looking through the
others. An entry is held under the user's name, or ``name`` + TAB_SEP + ``tab`` for a page that named itself.

A request's entries are one Redis hash (entry -> when it lapses), changed only in a transaction that
watches it: two reviewers opening the request at once (or one in two tabs) both end up in it, where a
read, change and write of the whole set kept only the last writer's.

A viewer whose page went without saying so (a closed laptop, a dropped connection) lapses silently. While
others still look at the request, the next touch tells the team; when nobody else does, no touch comes, so
each request with viewers is also indexed by when its last one lapses (a sorted set, `DUE`), and beat's
`presence_sweep` tells the team of those whose time passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.core.cache import cache
from django.db import transaction
from redis.exceptions import WatchError

from approvals import broadcast
from approvals.models import InputRequest
from approvals.redis_cache import RedisCache

logger = logging.getLogger(__name__)

PRESENCE_TTL = 30  # seconds; pages renew every 10


TAB_SEP = "\x00"  # no user name holds a NUL
TAB_LENGTH = 32  # at most this many characters of [A-Za-z0-9_-] name a tab; anything else names none
MAX_TABS = 16  # entries kept per user and request: past it, the user's entries due to lapse first go

DUE = "presence:due"  # request id -> when its last viewer lapses (seconds since the epoch)
SWEEP_BATCH = 500

_T = TypeVar("_T")


def _key(input_request_id: object) -> str:
    """The (namespaced) key of the request's hash of entries."""
    return cast(RedisCache, cache).make_and_validate_key(f"presence:viewers:{input_request_id}")


def _client() -> Any:
    """The Redis client the cache writes with (its hashes and the index are kept where the cache is)."""
    return cast(RedisCache, cache)._cache.get_client(None, write=True)


def _due_key() -> str:
    """The (namespaced) key of the index of requests with viewers."""
    return cast(RedisCache, cache).make_and_validate_key(DUE)


def _decoded(raw: dict[Any, Any]) -> dict[str, float]:
    entries: dict[str, float] = {}
    for name, until in raw.items():
        try:
            entries[name.decode() if isinstance(name, bytes) else str(name)] = float(until)
        except (TypeError, ValueError, UnicodeDecodeError):
            continue  # not an entry this module wrote: ignored, and gone with the next change
    return entries


def _watched(key: str, change: Callable[[Any, dict[str, float]], _T]) -> _T:
    """Run `change` (given a pipeline in transaction mode and the request's entries as read) until no other
    change of the request's entries came between its read and its write."""
    with _client().pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)
                result = change(pipe, _decoded(pipe.hgetall(key)))
                pipe.execute()
                return result
            except WatchError:
                continue


def _write(pipe: Any, key: str, member: str, entries: dict[str, float]) -> None:
    """Queue (MULTI) the request's entries as `entries`, and its place in the index."""
    pipe.multi()
    pipe.delete(key)
    if entries:
        pipe.hset(key, mapping={name: repr(until) for name, until in entries.items()})
        pipe.expire(key, PRESENCE_TTL)
        pipe.zadd(_due_key(), {member: max(entries.values())})
    else:
        pipe.zrem(_due_key(), member)


def _live(entries: dict[str, float], now: float) -> dict[str, float]:
    return {name: until for name, until in entries.items() if until > now}


def _names(entries: dict[str, float]) -> list[str]:
    """The users the entries hold, each once (a user looking from two tabs has two entries)."""
    return sorted({entry.split(TAB_SEP, 1)[0] for entry in entries})


def _bounded(entries: dict[str, float], name: str) -> None:
    """At most MAX_TABS entries of `name`: a page that draws a new tab name at every beat (or a script
    making up names) keeps the set, which every touch reads whole, small."""
    mine = sorted((until, entry) for entry, until in entries.items() if entry.split(TAB_SEP, 1)[0] == name)
    for _until, entry in mine[: max(0, len(mine) - MAX_TABS)]:
        del entries[entry]


def tab_of(value: Any) -> str:
    """The tab a page names itself by, when it is one (short, plain); "" otherwise."""
    if not isinstance(value, str) or not 0 < len(value) <= TAB_LENGTH:
        return ""
    return value if all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in value) else ""


def viewers(input_request_ids: list[Any]) -> dict[str, list[str]]:
    """Usernames looking at each request, by request id (as a string); absent ids have nobody."""
    if not input_request_ids:
        return {}
    ids = [str(pk) for pk in input_request_ids]
    try:
        with _client().pipeline(transaction=False) as pipe:
            for pk in ids:
                pipe.hgetall(_key(pk))
            found = pipe.execute()
    except Exception:
        return {}  # presence is a hint: a cache outage must not break the queue
    now = time.time()
    live = {pk: _live(_decoded(raw), now) for pk, raw in zip(ids, found, strict=True)}
    return {pk: _names(entries) for pk, entries in live.items() if entries}


def presence_touch(*, input_request: InputRequest, user: Any, tab: str = "") -> list[str]:
    """Mark `user` as looking at the request (from the page `tab`); tell the team when the set of viewers
    changed."""
    return _update(input_request, user.get_username(), tab_of(tab), time.time() + PRESENCE_TTL)


def presence_leave(*, input_request: InputRequest, user: Any, tab: str = "") -> list[str]:
    """The page `tab` of `user` closed: they stop looking unless another of their pages still does. Without
    a tab, every page of theirs counts as closed."""
    return _update(input_request, user.get_username(), tab_of(tab), None)


def _update(input_request: InputRequest, name: str, tab: str, until: float | None) -> list[str]:
    key, member = _key(input_request.pk), str(input_request.pk)
    entry = name + TAB_SEP + tab if tab else name

    def change(pipe: Any, stored: dict[str, float]) -> tuple[list[str], list[str]]:
        now = time.time()
        # Who the pages were last told about: lapsed entries included. A viewer whose page went without
        # saying so (a closed laptop, a dropped connection) lapses silently; the next update tells the team
        # they left.
        before = _names(stored)
        entries = _live(stored, now)
        if until is not None:
            entries[entry] = until
            _bounded(entries, name)
        elif tab:
            entries.pop(entry, None)
        else:
            entries = {other: at for other, at in entries.items() if other.split(TAB_SEP, 1)[0] != name}
        _write(pipe, key, member, entries)
        return before, _names(entries)

    before, after = _watched(key, change)
    if after != before:
        transaction.on_commit(lambda: broadcast.presence_changed(input_request, after))
    return after


def presence_sweep() -> int:
    """Tell the teams of the requests whose last viewers lapsed without a word that nobody looks at them
    any more; returns how many. Each is taken off the index first (``ZREM`` answers 1 to one sweeper only),
    and left alone when a viewer came back meanwhile (their touch indexed it again, and a touch between
    the sweep's look and its clearing makes the sweep look again)."""
    client, due = _client(), _due_key()
    now = time.time()
    told = 0
    for member in client.zrangebyscore(due, "-inf", now, start=0, num=SWEEP_BATCH):
        pk = member.decode() if isinstance(member, bytes) else str(member)
        if not client.zrem(due, pk):
            continue  # another sweep took it
        key = _key(pk)

        def clear(pipe: Any, stored: dict[str, float], pk: str = pk, key: str = key) -> bool:
            entries = _live(stored, now)
            if entries:
                pipe.multi()
                pipe.zadd(due, {pk: max(entries.values())})
                return False
            pipe.multi()
            pipe.delete(key)
            return True

        if not _watched(key, clear):
            continue
        ir = InputRequest.objects.select_related("team", "escalation_team").filter(pk=pk).first()
        if ir is not None:
            broadcast.presence_changed(ir, [])
            told += 1
    return told
