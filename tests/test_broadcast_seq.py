"""The per-group sequence numbers every notice carries (`broadcast.next_seq`), on the real Redis.

Every notice the hub sends (a round opened, an answer, a call's change, presence) takes one number first,
in the worker and in the web process, so its cost is paid several times per call.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.core.cache import cache

from approvals import broadcast


@pytest.fixture
def group() -> Iterator[str]:
    name = f"team.seq-{uuid.uuid4().hex[:12]}"
    yield name
    cache.delete(broadcast._seq_key(name))


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The Redis commands this process sends from now on (to the real server, which still answers them)."""
    sent: list[str] = []
    real = redis.Redis.execute_command

    def counting(self: redis.Redis, *args: Any, **options: Any) -> Any:
        sent.append(str(args[0]).upper())
        return real(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", counting)
    return sent


def test_numbers_count_up_from_one_and_start_again_after_redis_lost_them(group: str) -> None:
    assert [broadcast.next_seq(group) for _ in range(3)] == [1, 2, 3]
    cache.delete(broadcast._seq_key(group))  # Redis restarted without its data, or was flushed
    assert broadcast.next_seq(group) == 1


def test_a_number_costs_one_redis_command(group: str, commands: list[str]) -> None:
    broadcast.next_seq(group)  # the counter exists from here on
    commands.clear()

    assert broadcast.next_seq(group) == 2

    assert commands == ["INCRBY"]  # not SET NX + EXISTS + INCRBY


def test_a_teams_counter_never_expires_and_the_sockets_read_the_same_value(group: str) -> None:
    for _ in range(4):
        broadcast.next_seq(group)
    key = cache.make_and_validate_key(broadcast._seq_key(group))
    client = cache._cache.get_client(key)  # type: ignore[attr-defined]
    assert client.ttl(key) == -1  # no expiry: a counter that expired would look like a lost notice

    # What the sockets compare (one MGET on the event loop) and what the inbox's version hashes.
    assert async_to_sync(broadcast.acurrent_seqs)([group]) == {group: 4}
    assert cache.get(broadcast._seq_key(group)) == 4


def _ttl(group: str) -> int:
    key = cache.make_and_validate_key(broadcast._seq_key(group))
    return int(cache._cache.get_client(key).ttl(key))  # type: ignore[attr-defined]


def test_a_calls_counter_expires_a_day_after_the_calls_last_notice() -> None:
    """There is a call group per call ever made: a counter kept for good for each grew Redis by a key per
    call. A team's (the test above) has no expiry; a call's is renewed with every notice."""
    group = broadcast.call_group(uuid.uuid4())
    try:
        assert [broadcast.next_seq(group) for _ in range(2)] == [1, 2]
        assert 0 < _ttl(group) <= broadcast.CALL_SEQ_TTL == 24 * 3600
        key = cache.make_and_validate_key(broadcast._seq_key(group))
        cache._cache.get_client(key).expire(key, 5)  # type: ignore[attr-defined]  # as the day runs out
        # A notice that wakes the call's long-polls renews it too, in the same round trip.
        assert broadcast.next_seq(group, {"type": "call.changed", "status": "completed"}) == 3
        assert _ttl(group) > broadcast.CALL_SEQ_TTL - 60
    finally:
        cache.delete(broadcast._seq_key(group))


def test_an_unreachable_counter_gives_no_number(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(self: redis.Redis, *args: Any, **options: Any) -> Any:
        raise redis.ConnectionError("Redis is down")

    monkeypatch.setattr(redis.Redis, "execute_command", down)
    assert broadcast.next_seq("team.unreachable") is None  # the notice goes without one; the sockets resync
