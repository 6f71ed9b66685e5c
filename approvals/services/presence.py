"""Who is looking at an input request right now: short-lived entries in the cache (Redis), never rows.

A reviewer's page touches its request every few seconds while it is open; an entry nobody renews
lapses after PRESENCE_TTL. Best effort by design: a lost update only makes the hint a little stale.

A reviewer may have the request open in several tabs: each page names itself (``tab``, a random word it
draws when it opens) and its entry is its own, so one tab closing leaves the reviewer looking through the
others. An entry is held under the user's name, or ``name`` + TAB_SEP + ``tab`` for a page that named itself.

A viewer whose page went without saying so (a closed laptop, a dropped connection) lapses silently. While
others still look at the request, the next touch tells the team; when nobody else does, no touch comes, so
each request with viewers is also indexed by when its last one lapses (a sorted set, `DUE`), and beat's
`presence_sweep` tells the team of those whose time passed.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

from django.core.cache import cache
from django.db import transaction

from approvals import broadcast
from approvals.models import InputRequest
from approvals.redis_cache import RedisCache

logger = logging.getLogger(__name__)

PRESENCE_TTL = 30  # seconds; pages renew every 10


TAB_SEP = "\x00"  # no user name holds a NUL
TAB_LENGTH = 32  # at most this many characters of [A-Za-z0-9_-] name a tab; anything else names none

DUE = "presence:due"  # request id -> when its last viewer lapses (seconds since the epoch)
SWEEP_BATCH = 500


def _key(input_request_id: object) -> str:
    return f"presence:{input_request_id}"


def _due() -> tuple[Any, str]:
    """The Redis client and the (namespaced) key of the index of requests with viewers."""
    store = cast(RedisCache, cache)
    key = store.make_and_validate_key(DUE)
    return store._cache.get_client(key, write=True), key


def _live(entries: dict[str, float], now: float) -> dict[str, float]:
    return {name: until for name, until in entries.items() if until > now}


def _names(entries: dict[str, float]) -> list[str]:
    """The users the entries hold, each once (a user looking from two tabs has two entries)."""
    return sorted({entry.split(TAB_SEP, 1)[0] for entry in entries})


def tab_of(value: Any) -> str:
    """The tab a page names itself by, when it is one (short, plain); "" otherwise."""
    if not isinstance(value, str) or not 0 < len(value) <= TAB_LENGTH:
        return ""
    return value if all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in value) else ""


def viewers(input_request_ids: list[Any]) -> dict[str, list[str]]:
    """Usernames looking at each request, by request id (as a string); absent ids have nobody."""
    if not input_request_ids:
        return {}
    keys = {_key(pk): str(pk) for pk in input_request_ids}
    try:
        found = cache.get_many(list(keys))
    except Exception:
        return {}  # presence is a hint: a cache outage must not break the queue
    now = time.time()
    return {keys[key]: _names(_live(entries, now)) for key, entries in found.items() if _live(entries, now)}


def presence_touch(*, input_request: InputRequest, user: Any, tab: str = "") -> list[str]:
    """Mark `user` as looking at the request (from the page `tab`); tell the team when the set of viewers
    changed."""
    return _update(input_request, user.get_username(), tab_of(tab), time.time() + PRESENCE_TTL)


def presence_leave(*, input_request: InputRequest, user: Any, tab: str = "") -> list[str]:
    """The page `tab` of `user` closed: they stop looking unless another of their pages still does. Without
    a tab, every page of theirs counts as closed."""
    return _update(input_request, user.get_username(), tab_of(tab), None)


def _update(input_request: InputRequest, name: str, tab: str, until: float | None) -> list[str]:
    key = _key(input_request.pk)
    now = time.time()
    stored = cache.get(key) or {}
    # Who the pages were last told about: lapsed entries included. A viewer whose page went without saying
    # so (a closed laptop, a dropped connection) lapses silently; the next update tells the team they left.
    before = _names(stored)
    entries = _live(stored, now)
    entry = name + TAB_SEP + tab if tab else name
    if until is not None:
        entries[entry] = until
    elif tab:
        entries.pop(entry, None)
    else:
        entries = {other: at for other, at in entries.items() if other.split(TAB_SEP, 1)[0] != name}
    client, due = _due()
    if entries:
        cache.set(key, entries, PRESENCE_TTL)
        client.zadd(due, {str(input_request.pk): max(entries.values())})
    else:
        cache.delete(key)
        client.zrem(due, str(input_request.pk))
    after = _names(entries)
    if after != before:
        transaction.on_commit(lambda: broadcast.presence_changed(input_request, after))
    return after


def presence_sweep() -> int:
    """Tell the teams of the requests whose last viewers lapsed without a word that nobody looks at them
    any more; returns how many. Each is taken off the index first (``ZREM`` answers 1 to one sweeper only),
    and left alone when a viewer came back meanwhile (their touch indexed it again)."""
    client, due = _due()
    now = time.time()
    told = 0
    for member in client.zrangebyscore(due, "-inf", now, start=0, num=SWEEP_BATCH):
        pk = member.decode() if isinstance(member, bytes) else str(member)
        if not client.zrem(due, pk):
            continue  # another sweep took it
        entries = _live(cache.get(_key(pk)) or {}, now)
        if entries:
            client.zadd(due, {pk: max(entries.values())})
            continue
        cache.delete(_key(pk))
        ir = InputRequest.objects.select_related("team", "escalation_team").filter(pk=pk).first()
        if ir is not None:
            broadcast.presence_changed(ir, [])
            told += 1
    return told
