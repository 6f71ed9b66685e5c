"""A handshake-era session that the server ends mid-way, against third-party servers.

The hub opens a session, calls a plain tool, then the session is ended on the server (an HTTP DELETE with its
``Mcp-Session-Id``, as a server restart or an idle timeout would end it) and the hub calls the tool again on
the session it holds. Each server refuses that ``tools/call`` unread, as its SDK does (server-everything on
the TypeScript SDK: HTTP 404 with error -32001; FastMCP 2.x on mcp 1.x, mcp 2.3, FastMCP 4: HTTP 404): the
hub must call that ``session_expired`` (a refusal, the tool did not run, a new session may send it), never a
time-out nor a call that may have run.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import httpx2
import pytest

from approvals.mcp_client import Completed, McpError, ServerConfig
from approvals.mcp_client.session import Dispatcher, SessionHooks, call_on, http_transport, open_client
from tests.interop.conftest import ThirdPartyServer
from tests.interop.test_sessions import EVERYTHING, PYTHON, Kind

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["everything-http", "fastmcp2", "mcp23", "fastmcp4-handshake"])
def served(request: pytest.FixtureRequest) -> tuple[Kind, ThirdPartyServer]:
    fixture = {
        "everything-http": "everything_server",
        "fastmcp2": "fastmcp2_server",
        "mcp23": "mcp23_server",
        "fastmcp4-handshake": "fastmcp4_server",
    }[request.param]
    return (EVERYTHING if request.param == "everything-http" else PYTHON), request.getfixturevalue(fixture)


async def _never_asked(params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError(f"no elicitation expected: {params}")


def test_a_call_on_a_session_the_server_ended_is_refused_as_expired(
    served: tuple[Kind, ThirdPartyServer],
) -> None:
    kind, server = served
    tool, arguments, text = kind.plain
    counted = kind is PYTHON
    sessions: list[str] = []

    async def seen(request: httpx2.Request) -> None:
        if request.headers.get("mcp-session-id"):
            sessions.append(request.headers["mcp-session-id"])

    async def main() -> tuple[Any, Any, int | None, int | None]:
        dispatcher = Dispatcher()
        transport, http = http_transport(ServerConfig(url=server.url), read_timeout=60, dispatcher=dispatcher)
        http.event_hooks["request"].append(seen)
        hooks = SessionHooks(elicit=_never_asked)
        async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=30) as client:
            first = await call_on(client, dispatcher, hooks, tool, arguments, timeout=30)
            ended = httpx.delete(server.url, headers={"Mcp-Session-Id": sessions[-1]}, timeout=10)
            assert ended.status_code < 300, ended.text
            before = server.runs().get(tool, 0) if counted else None
            try:
                second: Any = await call_on(client, dispatcher, hooks, tool, arguments, timeout=30)
            except McpError as exc:
                second = exc
            after = server.runs().get(tool, 0) if counted else None
            return first, second, before, after

    first, second, before, after = anyio.run(main)
    assert isinstance(first, Completed), first
    assert first.result["content"][0]["text"] == text
    assert isinstance(second, McpError), second
    assert (second.code, second.transient, second.may_have_run) == ("session_expired", True, False), second
    assert before == after  # the tool did not run
