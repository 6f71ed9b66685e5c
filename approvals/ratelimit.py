"""The API's rate limits as sliding-window counters in Redis.

django-ninja's throttles keep every counted request's timestamp in a list that each request reads,
unpickles, trims and writes back: work in proportion to the rate (a token allowed 600 a minute carries up
to 600 timestamps through Redis on every request), and two processes that read the list at once each write
back their own, so one of the two requests is never counted. Under the load benchmark this was 5 % of the
web process's CPU, spent on the event loop's thread.

Here each key has one integer per window of the rate's period, kept in Redis and counted with ``INCR``
(atomic across processes): one pipelined round trip per request, whatever the rate. The limit applies to
the estimate ``previous window * (share of it still inside the sliding period) + this window``, so a burst
at a window's edge is not allowed twice over, as a fixed window would allow it. A refused request is taken
off the count again: a client that waits as told gets in.

Without a credential a client is counted by its address (``client_network``): an IPv6 address by its /64,
which a single host is given whole and may send from any address of.

While Redis is away, or answers but refuses writes (``approvals.outage.engine_of``: out of memory, read-only,
unable to save), the same counters are kept in this process's memory (the same limit per process), so the
limit neither fails the request nor stops limiting; the log says so once per outage, and again when Redis is
back. After a failure, this process counts in memory for ``RECHECK_AFTER`` seconds before it tries that Redis
again: a Redis that hangs rather than refusing costs each try its timeout twice over (the cache retries once),
which every request paid before it was counted.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import threading
import time
from typing import Any

import redis.exceptions
from django.core.cache import cache as default_cache
from django.core.cache.backends.locmem import LocMemCache
from django.db import models
from django.http import HttpRequest
from ninja.throttling import AnonRateThrottle, AuthRateThrottle, SimpleRateThrottle

from approvals.outage import engine_of

logger = logging.getLogger(__name__)

_local = LocMemCache("elicit-hub-ratelimit", {"MAX_ENTRIES": 20000})
# Set while this process counts in memory, so that an outage is logged once, not once per request.
_redis_away = threading.Event()
# Seconds after a failed try before a store is tried again; meanwhile its requests are counted in memory.
RECHECK_AFTER = 5.0
# id() of a store that failed -> the time.monotonic() from which to try it again.
_retry_at: dict[int, float] = {}


def _count_in_memory() -> None:
    if not _redis_away.is_set():  # once per outage: every request of it comes here
        _redis_away.set()
        logger.warning("rate limit counted in process memory: Redis unavailable")


def estimate(previous: int, current: int, elapsed: float) -> float:
    """Requests inside the sliding period, ``elapsed`` (0..1) into the current window."""
    return previous * (1.0 - elapsed) + current


def wait_for(limit: int, previous: int, current: int, elapsed: float, period: float) -> float:
    """Seconds until one more request fits under ``limit``, if none other comes meanwhile (``current``
    excludes that request)."""
    if current + 1 <= limit:
        if previous == 0:
            return 0.0
        # previous * (1 - e) + current + 1 <= limit
        fits_at = 1.0 - (limit - current - 1) / previous
        return max(0.0, (fits_at - elapsed) * period)
    # Not within this window: in the next one, this window's count slides out as the previous one.
    fits_at = 1.0 - (limit - 1) / current if current else 0.0
    return (1.0 - elapsed) * period + max(0.0, fits_at) * period


def client_network(address: str | None) -> str | None:
    """The client as the limits count it: an IPv4 address as itself (also when written inside IPv6), an IPv6
    address as its /64 network. A host is routinely given a whole /64 and may send from any of its 2**64
    addresses, so counting per IPv6 address let one client start afresh at will. Anything else (an
    unparsable value a proxy passed on) is kept as given."""
    if address is None:
        return None
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip), 64), strict=False))
    return str(ip)


class SlidingWindowMixin(SimpleRateThrottle):
    """``allow_request`` and ``wait`` of a ninja throttle, on counters (the key is the throttle's own)."""

    cache = default_cache  # the "default" cache, which is Redis

    def __init__(self, rate: str | None = None) -> None:
        super().__init__(rate)
        self._last = threading.local()  # the refused request's wait, for `wait()` right after

    def allow_request(self, request: HttpRequest) -> bool:
        key = self.get_cache_key(request)
        if key is None or self.num_requests is None or not self.duration:
            return True
        now = self.timer()  # type: ignore[misc]  # ninja keeps time.time as a class attribute
        window = int(now // self.duration)
        elapsed = (now - window * self.duration) / self.duration
        current_key, previous_key = f"{key}:{window}", f"{key}:{window - 1}"
        store: Any = self.cache
        if _retry_at.get(id(store), 0.0) > time.monotonic():
            _count_in_memory()  # failed a moment ago: not tried again yet
            store = _local
            previous, current = self._count_locally(current_key, previous_key)
        else:
            try:
                previous, current = self._count(store, current_key, previous_key)
            except redis.exceptions.RedisError as exc:
                if engine_of(exc) is None:
                    raise  # no outage: a fault of the hub's
                _retry_at[id(store)] = time.monotonic() + RECHECK_AFTER
                _count_in_memory()
                store = _local
                previous, current = self._count_locally(current_key, previous_key)
            else:
                _retry_at.pop(id(store), None)
                if _redis_away.is_set():
                    _redis_away.clear()
                    logger.warning("rate limit counted in Redis again")
        if estimate(previous, current, elapsed) <= self.num_requests:
            self._last.wait = None
            return True
        self._uncount(store, current_key)
        self._last.wait = wait_for(self.num_requests, previous, current - 1, elapsed, self.duration)
        return False

    def get_ident(self, request: HttpRequest) -> str | None:
        return client_network(super().get_ident(request))

    def wait(self) -> float | None:
        waited = getattr(self._last, "wait", None)
        return None if waited is None else max(1.0, math.ceil(waited))

    def _count(self, store: Any, current_key: str, previous_key: str) -> tuple[int, int]:
        """One round trip: count this request in its window, read the previous window's count."""
        current = store.make_and_validate_key(current_key)
        previous = store.make_and_validate_key(previous_key)
        client = store._cache.get_client(current, write=True)
        pipe = client.pipeline(transaction=False)
        pipe.incr(current)
        pipe.expire(current, 2 * int(self.duration or 1) + 1)
        pipe.get(previous)
        counted, _, before = pipe.execute()
        return int(before or 0), int(counted)

    def _count_locally(self, current_key: str, previous_key: str) -> tuple[int, int]:
        _local.add(current_key, 0, timeout=2 * (self.duration or 1) + 1)
        return int(_local.get(previous_key, 0)), _local.incr(current_key)

    def _uncount(self, store: Any, current_key: str) -> None:
        try:
            store.decr(current_key)
        except ValueError:
            pass  # expired meanwhile: nothing left to take off
        except redis.exceptions.RedisError as exc:
            if engine_of(exc) is None:
                raise
            # Redis just went away: the refused request stays counted


class TokenRateThrottle(SlidingWindowMixin, AuthRateThrottle):
    """Per credential (ELICIT_API_RATE): an agent's token, or the user a personal token or a session signs
    in. Keyed by the row's primary key: ninja keys it by ``str(request.auth)``, an agent's or a user's name,
    which a renamed agent leaves to whoever takes the name next."""

    def get_cache_key(self, request: HttpRequest) -> str:
        auth = getattr(request, "auth", None)
        if not isinstance(auth, models.Model):
            return super().get_cache_key(request)
        ident = hashlib.sha256(f"{auth._meta.label}:{auth.pk}".encode()).hexdigest()
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AnonymousRateThrottle(SlidingWindowMixin, AnonRateThrottle):
    """Per client address for requests without a credential (ELICIT_API_ANON_RATE)."""
