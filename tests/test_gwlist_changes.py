"""The gateway tells its clients when the tools they see change: `notifications/tools/list_changed` on a
handshake-era session's GET stream (`tools.listChanged: true` in its `initialize` result), and on a
2026-07-28 `subscriptions/listen` stream. The real gateway process, PostgreSQL, Redis and the official
Python SDK client of each era; the changes are made to the database as the hub's services make them, with
the Redis signal (`broadcast.tools_changed`) or without it (the gateway's own periodic read)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp
import mcp_types as types
import pytest
from django.utils import timezone
from mcp.client.streamable_http import streamable_http_client
from mcp.shared import subscriptions as changes_events

from approvals import broadcast
from approvals.gateway import changes
from approvals.models import McpServer
from approvals.services import servers, tokens
from tests import test_gateway as gateway_tests
from tests.test_gateway import GatewayHub

gateway = gateway_tests.gateway
gateway_process = gateway_tests.gateway_process
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)

SIGNALLED = 4.0  # seconds within which a signalled change reaches a client (the periodic read is slower)
QUIET = 3.0  # seconds a client is watched for a notification that must not come


@dataclass
class Watcher:
    """An SDK client on its own thread: it lists the tools, then records each tool list notification (a
    handshake-era session's, or a 2026-07-28 listen stream's) until stopped."""

    url: str
    token: str
    mode: str
    heard: list[float] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    list_changed: bool | None = None  # the capability the server declared
    ended: bool = False  # a listen stream the server ended
    error: BaseException | None = None
    thread: threading.Thread | None = None

    async def _run(self) -> None:
        async def on_message(message: Any) -> None:
            # A handshake-era session's (a listen stream's events are counted from the stream itself).
            if self.mode == "legacy" and isinstance(message, types.ToolListChangedNotification):
                self.heard.append(time.monotonic())

        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {self.token}"}, timeout=httpx2.Timeout(60)
        )
        client = mcp.Client(
            streamable_http_client(self.url, http_client=http),
            mode=self.mode,
            message_handler=on_message,
        )
        async with http, client:
            await client.list_tools()
            if self.mode == "legacy":
                tools = client.server_capabilities.tools
                self.list_changed = bool(tools and tools.list_changed)
                await anyio.sleep(0.5)  # the SDK opens its GET stream after the handshake
                self.ready.set()
                while not self.stop.is_set():
                    await anyio.sleep(0.05)
                return
            discovered = await client.session.send_discover("2026-07-28")
            self.list_changed = discovered["capabilities"].get("tools", {}).get("listChanged") is True
            async with (
                anyio.create_task_group() as group,
                client.listen(tools_list_changed=True) as subscription,
            ):
                self.ready.set()

                async def stopper() -> None:
                    while not self.stop.is_set():
                        await anyio.sleep(0.05)
                    group.cancel_scope.cancel()

                group.start_soon(stopper)
                async for event in subscription:
                    if isinstance(event, changes_events.ToolsListChanged):
                        self.heard.append(time.monotonic())
                self.ended = True  # the server closed the stream
                group.cancel_scope.cancel()

    def start(self) -> Watcher:
        def target() -> None:
            try:
                anyio.run(self._run)
            except BaseException as exc:  # reported to the test
                self.error = exc
                self.ready.set()

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        assert self.ready.wait(30), "the client did not connect"
        assert self.error is None, repr(self.error)
        return self

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)


@pytest.fixture
def watch(ghub: GatewayHub) -> Iterator[Callable[..., Watcher]]:
    started: list[Watcher] = []

    def start(mode: str, path: str = "/mcp", token: str | None = None) -> Watcher:
        watcher = Watcher(ghub.url + path, token or ghub.token, mode).start()
        started.append(watcher)
        return watcher

    yield start
    for watcher in started:
        watcher.close()


def _wait_heard(watcher: Watcher, count: int, seconds: float) -> float:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(watcher.heard) >= count:
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"no tools/list_changed within {seconds} s (heard {len(watcher.heard)})")


def _drop_tool(server: McpServer, name: str) -> None:
    """A refresh that stored the server's list without ``name`` (the service every listing stores through,
    which signals the change once committed)."""
    server.refresh_from_db()
    kept = [tool for tool in server.tools or [] if tool.get("name") != name]
    assert len(kept) < len(server.tools or [])
    servers._store_tools(server, kept, why="list_changed")


def _same_again(server: McpServer) -> None:
    """A refresh that stored the same list again (the hourly refresh of a server that did not change)."""
    server.refresh_from_db()
    McpServer.objects.filter(pk=server.pk).update(tools=server.tools, tools_fetched_at=timezone.now())


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_client_is_told_when_its_tools_change_and_not_otherwise(
    ghub: GatewayHub, watch: Callable[..., Watcher], mode: str
) -> None:
    watcher = watch(mode)
    assert watcher.list_changed is True  # the capability says the server sends it

    # A refresh that stored the same list, and a change another agent alone sees: nothing to tell.
    _same_again(ghub.hub.server)
    other = McpServer.objects.create(slug="other", name="Other", url=ghub.hub.server.url, tools=[])
    tokens.agent_create(name="other agent", servers=[other])
    McpServer.objects.filter(pk=other.pk).update(
        tools=[{"name": "t", "inputSchema": {"type": "object"}}], tools_fetched_at=timezone.now()
    )
    broadcast.tools_changed()
    time.sleep(QUIET)
    assert watcher.heard == []

    # A refresh that stored another list: told at once, on the signal the store sends.
    signalled = time.monotonic()
    _drop_tool(ghub.hub.server, "create_deployment")
    assert _wait_heard(watcher, 1, SIGNALLED) - signalled < SIGNALLED
    time.sleep(1)
    assert len(watcher.heard) == 1  # once per change

    # The agent loses the server (the admin's or the CLI's change of its servers signals it too).
    agent = ghub.hub.server.agents.get()
    signalled = time.monotonic()
    ghub.hub.server.agents.clear()
    assert _wait_heard(watcher, 2, SIGNALLED) - signalled < SIGNALLED

    # A change written without the signal: the periodic read finds it.
    McpServer.objects.filter(pk=other.pk).update(enabled=False)  # another agent's: nothing to tell
    # The agent given the server back by a write of the link row itself, which sends no m2m signal.
    ghub.hub.server.agents.through.objects.create(agentclient=agent, mcpserver=ghub.hub.server)
    _wait_heard(watcher, 3, changes.check_every() + 5)


def test_a_disabled_server_is_a_change_on_its_own_endpoint(
    ghub: GatewayHub, watch: Callable[..., Watcher]
) -> None:
    watcher = watch("legacy", "/mcp/demo")
    server = McpServer.objects.get(pk=ghub.hub.server.pk)
    server.enabled = False
    server.save()  # as the admin saves it: the model's signal tells the gateways
    _wait_heard(watcher, 1, SIGNALLED)


def test_a_revoked_agents_listen_stream_ends(ghub: GatewayHub, watch: Callable[..., Watcher]) -> None:
    watcher = watch("2026-07-28")
    tokens.agent_token_rotate(agent=ghub.hub.server.agents.get())  # signals the gateways itself
    deadline = time.monotonic() + SIGNALLED
    while not watcher.ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watcher.ended
    assert watcher.heard == []
