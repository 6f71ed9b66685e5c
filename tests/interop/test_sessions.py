"""The hub's handshake-era session layer (`approvals.mcp_client.session`) against third-party servers.

Each server runs as its own process (server-everything over Streamable HTTP and over stdio, FastMCP 2.x on
mcp 1.x in its own virtual environment, an mcp 2.3 MCPServer, FastMCP 4 on a handshake-era connection): the
hub opens a session, calls a plain tool, answers the server's `elicitation/create` as a reviewer would (the
typed answer, a decline, a cancel) and hears a long tool's progress. The servers report what they received.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from mcp.client.stdio import StdioServerParameters

from approvals.mcp_client import Completed, ServerConfig
from approvals.mcp_client.session import Dispatcher, SessionHooks, call_on, http_transport, open_client
from tests.interop.conftest import ThirdPartyServer, everything_stdio_command

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Kind:
    """How one server names its tools and reports an elicitation's outcome."""

    plain: tuple[str, dict[str, Any], str]  # tool, arguments, the text it returns
    ask: tuple[str, dict[str, Any]]  # the tool that elicits, its arguments
    answer: dict[str, Any]  # what the reviewer types
    shows: Callable[[str, dict[str, Any] | None], list[str]]  # texts the result holds for an answer
    slow: tuple[str, Callable[[int], dict[str, Any]]]


def _python_shows(action: str, content: dict[str, Any] | None) -> list[str]:
    return [f"{action}: {content}" if action == "accept" else action]


def _everything_shows(action: str, content: dict[str, Any] | None) -> list[str]:
    raw = json.dumps({"action": action, **({"content": content} if content else {})}, indent=2)
    if action == "accept":
        return ["✅ User provided the requested information!", f"- Name: {content['name']}", raw]  # type: ignore[index]
    return [raw]


PYTHON = Kind(
    plain=("add", {"a": 2, "b": 40}, "42"),
    ask=("book_table", {"restaurant": "Chez Ada"}),
    answer={"name": "Grace Hopper", "seats": 4},
    shows=_python_shows,
    slow=("slow_report", lambda s: {"seconds": s}),
)
EVERYTHING = Kind(
    plain=("echo", {"message": "hi there"}, "Echo: hi there"),
    ask=("trigger-elicitation-request", {}),
    answer={"name": "Grace Hopper", "check": True, "integer": 7},
    shows=_everything_shows,
    slow=("trigger-long-running-operation", lambda s: {"duration": s, "steps": s}),
)


class Target:
    """One way to reach a server: a Streamable HTTP URL or a stdio command."""

    def __init__(self, kind: Kind, server: ThirdPartyServer | None = None, stdio: bool = False) -> None:
        self.kind = kind
        self.server = server
        self.stdio = stdio

    def run(self, body: Callable[[Any, Dispatcher], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            dispatcher = Dispatcher()
            if self.stdio:
                command, args = everything_stdio_command()
                params = StdioServerParameters(command=command, args=args)
                async with open_client(params, mode="legacy", dispatcher=dispatcher, timeout=30) as client:
                    return await body(client, dispatcher)
            assert self.server is not None
            config = ServerConfig(url=self.server.url)
            transport, http = http_transport(config, read_timeout=120, dispatcher=dispatcher)
            async with (
                http,
                open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=30) as client,
            ):
                return await body(client, dispatcher)

        return anyio.run(main)

    def runs(self, tool: str) -> int | None:
        """How often the server ran `tool`, for the servers that count (server-everything does not)."""
        if self.server is None or self.kind is EVERYTHING:
            return None
        return self.server.runs().get(tool, 0)


@pytest.fixture(params=["everything-http", "everything-stdio", "fastmcp2", "mcp23", "fastmcp4-handshake"])
def target(request: pytest.FixtureRequest) -> Target:
    name = request.param
    if name == "everything-http":
        return Target(EVERYTHING, request.getfixturevalue("everything_server"))
    if name == "everything-stdio":
        request.getfixturevalue("interop_installed")
        return Target(EVERYTHING, stdio=True)
    fixture = {
        "fastmcp2": "fastmcp2_server",
        "mcp23": "mcp23_server",
        "fastmcp4-handshake": "fastmcp4_server",
    }
    return Target(PYTHON, request.getfixturevalue(fixture[name]))


def _texts(outcome: Any) -> list[str]:
    return [c.get("text", "") for c in outcome.result.get("content", [])]


async def _never_asked(params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError(f"no elicitation expected: {params}")


def test_a_plain_tool_completes(target: Target) -> None:
    tool, arguments, text = target.kind.plain
    before = target.runs(tool)

    async def body(client: Any, dispatcher: Dispatcher) -> Any:
        hooks = SessionHooks(elicit=_never_asked)
        return await call_on(client, dispatcher, hooks, tool, arguments, timeout=30)

    outcome = target.run(body)
    assert isinstance(outcome, Completed), outcome
    assert _texts(outcome)[0] == text
    if before is not None:
        assert target.runs(tool) == before + 1


@pytest.mark.parametrize("action", ["accept", "decline", "cancel"])
def test_the_reviewers_answer_reaches_the_server(target: Target, action: str) -> None:
    tool, arguments = target.kind.ask
    content = target.kind.answer if action == "accept" else None
    asked: list[dict[str, Any]] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        await anyio.sleep(1)  # a person takes a moment; the session stays open meanwhile
        return {"action": action, **({"content": content} if content else {})}

    async def body(client: Any, dispatcher: Dispatcher) -> Any:
        return await call_on(client, dispatcher, SessionHooks(elicit=elicit), tool, arguments, timeout=30)

    outcome = target.run(body)
    assert isinstance(outcome, Completed), outcome
    assert len(asked) == 1
    assert asked[0]["message"]
    assert asked[0]["requestedSchema"]["properties"]["name"]["type"] == "string"
    text = "\n".join(_texts(outcome))
    for expected in target.kind.shows(action, content):
        assert expected in text, text


def test_a_long_tool_reports_progress_and_runs_once(target: Target) -> None:
    tool, arguments = target.kind.slow
    before = target.runs(tool)
    seen: list[tuple[float, float | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total))

    async def body(client: Any, dispatcher: Dispatcher) -> Any:
        hooks = SessionHooks(elicit=_never_asked, progress=progress)
        return await call_on(client, dispatcher, hooks, tool, arguments(3), timeout=30)

    outcome = target.run(body)
    assert isinstance(outcome, Completed), outcome
    assert seen == [(1, 3), (2, 3), (3, 3)]
    if before is not None:
        assert target.runs(tool) == before + 1
