"""Django's Redis cache, with its connections shared by the whole process.

Django keeps one cache object per thread and, under ASGI, per request context (``caches`` is an
``asgiref.local.Local``), and each object builds its own ``RedisCacheClient`` with its own connection
pools. Under Daphne every request therefore opened a new Redis connection (and redis-py read its own
package metadata for the connection's ``CLIENT SETINFO``), and every command built a new ``redis.Redis``
object: most of a small API request's CPU (the throttle reads and writes the cache on each request). Here
one client per configuration serves every cache object of the process, with one ``redis.Redis`` per pool;
both are thread-safe, and redis-py's pools reset themselves in a forked child (a Celery prefork worker).
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple[tuple[str, ...], str], RedisCacheClient] = {}
_lock = threading.Lock()


class SharedRedisCacheClient(RedisCacheClient):
    """One ``redis.Redis`` per connection pool instead of one per command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._redis_by_pool: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        django_client: Any = self  # Django's private attributes, which its type stubs leave out
        pool = django_client._get_connection_pool(write)
        if id(pool) not in self._redis_by_pool:
            self._redis_by_pool[id(pool)] = django_client._client(connection_pool=pool)
        return self._redis_by_pool[id(pool)]


class RedisCache(DjangoRedisCache):
    """``django.core.cache.backends.redis.RedisCache`` whose client (and so its pools) the process shares."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedRedisCacheClient

    def count(self, key: str, version: int | None = None, *, step: int = 1) -> int:
        """Add `step` (one) to the counter at `key` and return it; a missing counter counts from 0, and it
        never expires. One INCRBY: Django's ``incr`` asks EXISTS first (and refuses a missing key), so a
        counter built on ``add`` + ``incr`` costs three round trips. The value is a plain integer, which
        ``get`` reads back."""
        key = self.make_and_validate_key(key, version=version)
        return int(self._cache.get_client(key, write=True).incrby(key, step))

    @cached_property
    def _cache(self) -> RedisCacheClient:
        django_cache: Any = self  # Django's private attributes, which its type stubs leave out
        servers, options = django_cache._servers, django_cache._options
        key = (tuple(servers), repr(sorted(options.items())))
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(servers, **options)
        return client
