"""Telling the gateway's clients that their tool list changed: `notifications/tools/list_changed`.

What an agent sees on `/mcp` (or `/mcp/<slug>`) is made of the stored tool lists of the enabled servers it
may use. It changes when a server's stored list is written with other tools (a refresh, `check_server`, a
stdio server's holder), when a server is added, renamed, disabled or removed, and when the agent's servers
change. A client learns of it as its protocol era says:

- a handshake-era session (2025-06-18, 2025-11-25; `tools.listChanged: true` in the `initialize` result)
  gets `notifications/tools/list_changed` on its standalone GET stream;
- a 2026-07-28 client, which has no session, opens a `subscriptions/listen` stream asking for
  `toolsListChanged` (`server/discover` says `tools.listChanged: true`); the notification comes on that
  stream, stamped with its subscription id.

One watcher per gateway process (`ToolWatch`) serves every such client. It waits on the Redis counter
`broadcast.TOOLS` (`broadcast.tools_changed`, published by whatever changed the servers, wakes it at once)
and reads anyway every ELICIT_GATEWAY_TOOLS_CHECK seconds (a change made without the signal, a signal lost
while Redis was away). A read is two small queries for the whole process, whatever the number of clients:
each server's slug, flag and the stamp of its stored list (when and how large), and the servers of the
agents that have clients; the digest of a stored list is read only for a server whose stamp moved. A
client is told only when the digest of its own tools (its servers, their lists) differs from the one it
was last told of: a refresh that stored the same list again, or another agent's change, tells it nothing.

An agent deactivated, or given a new token, while a client of it listens loses its streams at the next read:
its listen streams end, and the GET streams of its handshake-era sessions are closed (an open GET stream
keeps a session from ever going idle: it would outlive the credential that opened it; without it the
session idles out, after a tools/call still waiting on it got its `agent_revoked` error).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable

from django.conf import settings
from django.db import connection

from approvals import broadcast
from approvals.models import AgentClient

logger = logging.getLogger(__name__)

Key = tuple[int, str | None]  # (agent id, server slug on `/mcp/<slug>`, None on `/mcp`)
NOTIFY_TIMEOUT = 5.0  # seconds one client's notification may take (a client that stopped reading its stream)
# Seconds between two reads at least: a server whose list changes at every listing (or that keeps saying it
# changed) costs each client one notification (and one tools/list) a second at most, however many signals.
MIN_GAP = 1.0


def check_every() -> float:
    """Seconds between two reads without a signal (ELICIT_GATEWAY_TOOLS_CHECK, default 10)."""
    return float(settings.ELICIT_GATEWAY_TOOLS_CHECK)


@dataclasses.dataclass(eq=False)
class Listener:
    """One client told of changes: a handshake-era session, or a 2026-07-28 listen stream."""

    key: Key
    token_hash: str  # the agent's token when the client came: another one now means the agent was revoked
    notify: Callable[[], Awaitable[None]]  # send `notifications/tools/list_changed` (never raises)
    end: Callable[[], Awaitable[None]]  # the agent was revoked: end the stream or the session
    alive: Callable[[], bool] = lambda: True  # False once the client is gone (its session ended)
    stream: bool = False  # a listen stream (counted against the agent's share), not a session


@dataclasses.dataclass(frozen=True)
class _Read:
    """One read of what the clients' tool lists are made of."""

    agents: dict[int, tuple[bool, str]]  # agent id: (active, token hash)
    links: dict[int, set[int]]  # agent id: its servers' ids
    servers: dict[int, tuple[str, bool, str]]  # server id: (slug, enabled, stamp of its stored list)
    digests: dict[int, str]  # server id: digest of its stored list, for the servers whose stamp moved


# Every server's slug, flag and the stamp of its stored list: when it was written and its stored size (read
# from the row, without unpacking the list). Then the digest of the lists whose stamp moved.
_STAMPS = """
    SELECT id, slug, enabled,
        coalesce(tools_fetched_at::text, '') || '/' || coalesce(pg_column_size(tools), -1)::text
    FROM approvals_mcpserver
"""
_DIGESTS = "SELECT id, coalesce(md5(tools::text), '') FROM approvals_mcpserver WHERE id = ANY(%s)"


def _read(agent_ids: list[int], stamps: dict[int, str]) -> _Read:
    """The watched agents, their servers, every server's stamp; the digests of the lists whose stamp is not
    ``stamps``'s (a stored list is read only then: it may be megabytes)."""
    agents = {
        pk: (active, token)
        for pk, active, token in AgentClient.objects.filter(pk__in=agent_ids).values_list(
            "pk", "is_active", "token_hash"
        )
    }
    links: dict[int, set[int]] = {pk: set() for pk in agents}
    through = AgentClient.servers.through
    for agent_id, server_id in through.objects.filter(agentclient_id__in=agent_ids).values_list(
        "agentclient_id", "mcpserver_id"
    ):
        links.setdefault(agent_id, set()).add(server_id)
    with connection.cursor() as cursor:
        cursor.execute(_STAMPS)
        servers = {pk: (slug, enabled, stamp) for pk, slug, enabled, stamp in cursor.fetchall()}
        moved = [pk for pk, (_, _, stamp) in servers.items() if stamps.get(pk) != stamp]
        digests: dict[int, str] = {}
        if moved:
            cursor.execute(_DIGESTS, [moved])
            digests = dict(cursor.fetchall())
    return _Read(agents, links, servers, digests)


def _run_read(agent_ids: list[int], stamps: dict[int, str]) -> _Read:
    try:
        return _read(agent_ids, stamps)
    finally:
        connection.close()  # back to the pool: the watcher holds none between reads


class ToolWatch:
    """Every client of one gateway process that is told of tool list changes, and the one task that reads
    for them (`check_every`, or at once on `broadcast.tools_changed`)."""

    def __init__(self) -> None:
        self.listeners: dict[Key, set[Listener]] = {}
        self.told: dict[Key, str] = {}  # the digest of each key's tools its clients were last told of
        self._stamps: dict[int, str] = {}  # server id: the stamp its digest was read at
        self._digests: dict[int, str] = {}  # server id: digest of its stored list
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one read at a time (the watcher's, a new client's)

    def streams_of(self, agent_id: int | None) -> int:
        """The listen streams open in this process: the agent's, or everyone's (None)."""
        return sum(
            1
            for (agent, _), found in self.listeners.items()
            if agent_id is None or agent == agent_id
            for listener in found
            if listener.stream
        )

    async def add(self, listener: Listener) -> None:
        """Watch for ``listener``; its key's tools now are what it is told changes from."""
        self.listeners.setdefault(listener.key, set()).add(listener)
        try:
            if listener.key not in self.told:
                async with self._lock:
                    if listener.key not in self.told:
                        read = await self._fetch([listener.key[0]])
                        self.told[listener.key] = self._digest(listener.key, read)
        except BaseException:  # the read failed, or the client went meanwhile: it is not watched
            self.remove(listener)
            raise
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def remove(self, listener: Listener) -> None:
        found = self.listeners.get(listener.key)
        if found is None:
            return
        found.discard(listener)
        if not found:
            del self.listeners[listener.key]
            self.told.pop(listener.key, None)

    async def _fetch(self, agent_ids: list[int]) -> _Read:
        read = await asyncio.to_thread(_run_read, agent_ids, dict(self._stamps))
        for pk, digest in read.digests.items():
            self._digests[pk] = digest
            self._stamps[pk] = read.servers[pk][2]
        for pk in list(self._stamps):
            if pk not in read.servers:  # deleted
                del self._stamps[pk]
                self._digests.pop(pk, None)
        return read

    def _digest(self, key: Key, read: _Read) -> str:
        """What ``key``'s tools are made of: its agent's enabled servers (the one slug's on `/mcp/<slug>`),
        each by its slug and the digest of its stored list."""
        agent_id, slug = key
        active, _ = read.agents.get(agent_id, (False, ""))
        parts: list[str] = []
        if active:
            for pk in read.links.get(agent_id, set()):
                found = read.servers.get(pk)
                if found is None or not found[1] or (slug is not None and found[0] != slug):
                    continue
                parts.append(f"{found[0]}\0{self._digests.get(pk, '')}")
        return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()

    async def check(self) -> None:
        """Read once for every client; tell those whose tools changed, end those whose agent was revoked."""
        for found in list(self.listeners.values()):
            for listener in [listener for listener in found if not listener.alive()]:
                self.remove(listener)
        if not self.listeners:
            return
        async with self._lock:
            read = await self._fetch(sorted({agent for agent, _ in self.listeners}))
            tell: list[Listener] = []
            ended: list[Listener] = []
            for key, found in list(self.listeners.items()):
                active, token = read.agents.get(key[0], (False, ""))
                for listener in list(found):
                    if not active or token != listener.token_hash:
                        ended.append(listener)
                        self.remove(listener)
                if key not in self.listeners:
                    continue
                digest = self._digest(key, read)
                if digest != self.told.get(key):
                    self.told[key] = digest
                    tell += self.listeners[key]
        await asyncio.gather(*(self._bounded(listener.notify) for listener in tell))
        await asyncio.gather(*(self._bounded(listener.end) for listener in ended))

    @staticmethod
    async def _bounded(action: Callable[[], Awaitable[None]]) -> None:
        try:
            await asyncio.wait_for(action(), NOTIFY_TIMEOUT)
        except Exception:  # one client's failure (or one that stopped reading) is not the others'
            logger.info("gateway: a client could not be told its tool list changed", exc_info=True)

    async def _counter(self) -> int:
        return (await broadcast.acurrent_seqs([broadcast.TOOLS]))[broadcast.TOOLS]

    async def _watch(self) -> None:
        """Read on each signal (the counter moved) and every `check_every` seconds, while anyone listens."""
        loop = asyncio.get_running_loop()
        seen: int | None = None
        while self.listeners:
            started = loop.time()
            try:
                last = seen if seen is not None else await self._counter()
                seen = last

                async def moved(last: int = last) -> bool:
                    nonlocal seen
                    seen = await self._counter()
                    return seen != last

                await broadcast.wait_until([broadcast.TOOLS], check_every(), moved)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis unreachable: the reads go on, every check_every() seconds
                seen = None
                await asyncio.sleep(max(0.0, check_every() - (loop.time() - started)))
            checked = loop.time()
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("gateway: the tool lists could not be read for changes", exc_info=True)
            await asyncio.sleep(max(0.0, MIN_GAP - (loop.time() - checked)))
