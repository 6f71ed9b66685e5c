"""The send lease (approvals.services.leases) on the real Redis: taken by one sender at a time, renewed while
its holder lives, let go by its holder only, lapsing when its holder stops renewing."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
from django.core.cache import cache
from redis.exceptions import ConnectionError as RedisConnectionError

from approvals.services import leases
from tests.live import child_env, wait_until


def _raw(call_id: str) -> bytes | None:
    key = leases._key(call_id)
    return leases._client(key).get(key)


def test_one_holder_at_a_time_and_free_once_let_go() -> None:
    call_id = str(uuid.uuid4())
    assert not leases.held(call_id)
    with leases.leased(call_id) as elsewhere:
        assert elsewhere is None
        assert leases.held(call_id)
        with leases.leased(call_id) as second:
            assert second is not None and 0 < second <= leases.ttl()
        assert leases.held(call_id)  # the refused second taker did not let the first one's lease go
    assert not leases.held(call_id)
    with leases.leased(call_id) as again:
        assert again is None


def lease_holder(call_id: str, *, holding: str = "time.sleep(60)", after: str = "") -> subprocess.Popen[str]:
    """A process that has taken the call's lease (ELICIT_SEND_LEASE 3 s, so renewed every second) and said
    "held"; it runs `holding` while it holds the lease, then `after` (Python statements). The caller kills
    it."""
    code = (
        "import django, time; django.setup(); from approvals.services import leases\n"
        f"with leases.leased({call_id!r}):\n"
        f"    print('held', flush=True); {holding}\n"
        f"{after}\n"
    )
    env = child_env(DJANGO_SETTINGS_MODULE="elicit_hub.settings", ELICIT_SEND_LEASE="3")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_dead_holders_lease_lapses() -> None:
    """A process that takes a lease keeps it for as long as it lives (its thread renews it); killed, the lease
    outlives it by at most its time to live."""
    call_id = str(uuid.uuid4())
    proc = lease_holder(call_id)
    try:
        time.sleep(4)  # longer than the lease lives: the holder's thread renewed it
        with leases.leased(call_id) as elsewhere:
            assert elsewhere is not None
    finally:
        proc.kill()
        proc.wait(10)
    wait_until(lambda: not leases.held(call_id), 5, 0.1, what="the dead holder's lease to lapse")
    with leases.leased(call_id) as elsewhere:
        assert elsewhere is None


def test_a_lapsed_lease_taken_by_another_is_not_let_go_by_its_first_holder() -> None:
    call_id = str(uuid.uuid4())
    key = leases._key(call_id)
    with leases.leased(call_id):
        leases._client(key).set(key, "another-sender", px=10_000)  # the first lapsed; another took it
    assert _raw(call_id) == b"another-sender"
    leases._client(key).delete(key)


def test_redis_unreachable_leaves_the_send_to_the_lock(monkeypatch, caplog) -> None:
    def unreachable(key: str) -> object:
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(leases, "_client", unreachable)
    call_id = str(uuid.uuid4())
    with leases.leased(call_id) as elsewhere:
        assert elsewhere is None
    assert not leases.held(call_id)
    assert "no send lease" in caplog.text


@pytest.fixture(autouse=True)
def _namespace() -> None:
    cache.get("warm-up")  # the cache client exists before a test replaces its parts
