"""PostgreSQL session advisory locks held across an outbound request made outside any transaction (a send,
a webhook's POST, a team notice): one process at a time does the work, and a process that dies mid-request
lets go of the lock with its database connection."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


def lock_key(name: str) -> int:
    """The 64-bit advisory lock key of `name` (``send:<call>``, ``webhook:<id>``, ``notice:<id>``)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def try_lock(name: str) -> Iterator[bool]:
    """Take the session advisory lock on `name` if it is free; yields whether it was taken."""
    key = lock_key(name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s::bigint)", [key])
        (acquired,) = cursor.fetchone()
    try:
        yield acquired
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s::bigint)", [key])
