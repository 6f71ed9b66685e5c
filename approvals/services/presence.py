"""Who is looking at an input request right now: short-lived entries in the cache (Redis), never rows.

A reviewer's page touches its request every few seconds while it is open; an entry nobody renews
lapses after PRESENCE_TTL. Best effort by design: a lost update only makes the hint a little stale.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.cache import cache
from django.db import transaction

from approvals import broadcast
from approvals.models import InputRequest

PRESENCE_TTL = 30  # seconds; pages renew every 10


def _key(input_request_id: object) -> str:
    return f"presence:{input_request_id}"


def _live(entries: dict[str, float], now: float) -> dict[str, float]:
    return {name: until for name, until in entries.items() if until > now}


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
    return {keys[key]: sorted(_live(entries, now)) for key, entries in found.items() if _live(entries, now)}


def presence_touch(*, input_request: InputRequest, user: Any) -> list[str]:
    """Mark `user` as looking at the request; tell the team when the set of viewers changed."""
    return _update(input_request, user.get_username(), time.time() + PRESENCE_TTL)


def presence_leave(*, input_request: InputRequest, user: Any) -> list[str]:
    return _update(input_request, user.get_username(), None)


def _update(input_request: InputRequest, name: str, until: float | None) -> list[str]:
    key = _key(input_request.pk)
    now = time.time()
    stored = cache.get(key) or {}
    # Who the pages were last told about: lapsed entries included. A viewer whose page went without saying
    # so (a closed laptop, a dropped connection) lapses silently; the next update tells the team they left.
    before = sorted(stored)
    entries = _live(stored, now)
    if until is None:
        entries.pop(name, None)
    else:
        entries[name] = until
    if entries:
        cache.set(key, entries, PRESENCE_TTL)
    else:
        cache.delete(key)
    after = sorted(entries)
    if after != before:
        transaction.on_commit(lambda: broadcast.presence_changed(input_request, after))
    return after
