"""A send's lease in Redis: which process is sending a call, renewed while that process lives.

The call's PostgreSQL advisory lock (`sending.send_lock`) keeps a second worker from sending a call another
is sending, and it goes with the sender's database session. That session can be lost while the process lives
on and waits for the server's answer (PostgreSQL restarted or failed over, the session ended by an
administrator): the process records the answer on a new session once PostgreSQL is back
(`sending._recorded`). Meanwhile the lock is free, and beat's `recover_stuck` would hand the call to another
worker, which would find the send claimed and never released: it would end the call ``outcome_unknown`` (or
send it again, when that is safe) while the server was still running it, and the answer, when it came, would
no longer be the first worker's to write.

The lease says the sender is alive, apart from PostgreSQL: one key per call holding a token of the send,
written (``SET NX``) when the send starts, renewed by one thread per process every third of `ttl()`
(ELICIT_SEND_LEASE, 15 s) for as long as the send lasts (written again if Redis lost it meanwhile: restarted,
flushed, evicted), and deleted when it ends, by its holder only. A
process that dies stops renewing: its lease lapses within `ttl()` seconds. A worker that takes a call's lock
while another process's lease is live waits for it to end or lapse; `recover_stuck` leaves such a call alone.

Redis unreachable: no lease is written or read and the lock alone decides. (The broker is on the
same Redis: no task runs then anyway.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError

from approvals.redis_cache import RedisCache

logger = logging.getLogger(__name__)


def ttl() -> float:
    """Seconds a lease lives without renewal (ELICIT_SEND_LEASE); it is renewed every third of that."""
    return float(settings.ELICIT_SEND_LEASE)


# Renew or delete a lease only while it is still the holder's: a lease that lapsed (the holder paused longer
# than its time to live) and was taken by another process is that process's.
_IF_HELD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call({}) end return 0"
# A lease gone from Redis while its holder still sends (Redis restarted, or evicted it, or it was flushed) is
# written again: else a worker whose PostgreSQL session is lost too would look dead to the others.
_RENEW = (
    "local held = redis.call('get', KEYS[1])"
    " if held == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end"
    " if not held then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end"
    " return 0"
)
_RELEASE = _IF_HELD.format("'del', KEYS[1]")


def _key(call_id: Any) -> str:
    return cast(RedisCache, cache).make_and_validate_key(f"send-lease:{call_id}")


def _client(key: str) -> Any:
    return cast(RedisCache, cache)._cache.get_client(key, write=True)


class _Renewer:
    """The process's renewing thread and the leases it keeps alive. Started on the first lease a process
    takes, and again in a forked child (a Celery prefork worker), which inherits no thread."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._mutex = threading.Lock()
        self._pid = 0

    def add(self, key: str, token: str) -> None:
        with self._mutex:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._held = {}
                threading.Thread(target=self._run, name="send-leases", daemon=True).start()
            self._held[key] = token

    def remove(self, key: str) -> None:
        """Stop renewing `key`; once this returns no renewal of it is under way (one would write it again
        after its holder deleted it)."""
        with self._mutex:
            self._held.pop(key, None)

    def _run(self) -> None:
        pid = os.getpid()
        stop = threading.Event()
        while not stop.wait(ttl() / 3) and pid == os.getpid():
            # Under the mutex, bounded by the client's time-outs (ELICIT_REDIS_TIMEOUT): see `remove`.
            with self._mutex:
                held = list(self._held.items())
                if held:
                    self._renew(held)

    def _renew(self, held: list[tuple[str, str]]) -> None:
        try:
            pipe = _client(held[0][0]).pipeline(transaction=False)
            for key, token in held:
                pipe.eval(_RENEW, 1, key, token, int(ttl() * 1000))
            pipe.execute()
        except Exception:  # the thread must outlive any fault: a lease it stops renewing lapses mid-send
            logger.warning(
                "could not renew %d send lease(s); they lapse in %g s", len(held), ttl(), exc_info=True
            )


_renewer = _Renewer()


@contextmanager
def leased(call_id: Any) -> Iterator[float | None]:
    """Take the call's send lease for the block's length. Yields None when this process holds it (or Redis
    could not be asked), else the seconds left on another process's lease: the call is being sent there."""
    key, token = _key(call_id), secrets.token_hex(8)
    try:
        client = _client(key)
        if not client.set(key, token, nx=True, px=int(ttl() * 1000)):
            left = int(client.pttl(key))
            if left > 0:
                yield left / 1000
                return
            client.set(key, token, px=int(ttl() * 1000))  # lapsed between the two commands
    except RedisError:
        logger.warning("no send lease for call %s: Redis did not answer", call_id)
        yield None
        return
    _renewer.add(key, token)
    try:
        yield None
    finally:
        _renewer.remove(key)
        with contextlib.suppress(RedisError):  # else it lapses by itself
            client.eval(_RELEASE, 1, key, token)


def held(call_id: Any) -> bool:
    """Whether some process holds a live lease on the call's send (False when Redis does not answer)."""
    key = _key(call_id)
    try:
        return int(_client(key).pttl(key)) > 0
    except RedisError:
        return False
