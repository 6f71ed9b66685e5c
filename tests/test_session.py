"""Handshake-era sessions (`approvals.mcp_client.session`) against a real server.

The server (tests/push_server.py) is an ``mcp`` 2.3 `MCPServer` whose tools use ``ctx.elicit()``, served over
Streamable HTTP with sessions by uvicorn in a subprocess on a free loopback port.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from approvals.mcp_client import Completed, PermanentError, ServerConfig, TransientError, list_tools, run
from approvals.mcp_client.session import (
    Dispatcher,
    SessionHooks,
    UrlRequired,
    call_on,
    http_transport,
    open_client,
)
from tests.live import CountingServer
from tests.test_mcp_client import LiveServer

SCRIPT = Path(__file__).with_name("push_server.py")
WAIT = 4.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PushServer(CountingServer):
    def __init__(self, wait: float = WAIT) -> None:
        super().__init__(SCRIPT, "the push test server", "--wait", str(wait))

    def authorize(self) -> None:
        """The person has been to the -32042 URL: ``needs_auth`` works from now on."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/_authorize", method="POST")
        with urllib.request.urlopen(request, timeout=2):
            pass


@pytest.fixture(scope="module")
def push() -> Iterator[PushServer]:
    server = PushServer()
    try:
        yield server
    finally:
        server.stop()


def _run(
    url: str, body: Callable[[Any, Dispatcher], Awaitable[Any]], *, mode: str = "legacy", timeout: float = 10
) -> Any:
    async def main() -> Any:
        dispatcher = Dispatcher()
        transport, http = http_transport(ServerConfig(url=url), read_timeout=60, dispatcher=dispatcher)
        async with http, open_client(transport, mode=mode, dispatcher=dispatcher, timeout=timeout) as client:  # type: ignore[arg-type]
            return await body(client, dispatcher)

    return anyio.run(main)


def _answering(answer: dict[str, Any], asked: list[dict[str, Any]], delay: float = 0.0) -> SessionHooks:
    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        await anyio.sleep(delay)
        return answer

    return SessionHooks(elicit=elicit)


def _text(outcome: Any) -> str:
    assert isinstance(outcome, Completed), outcome
    return str(outcome.result["content"][0]["text"])


def test_elicitation_answer_reaches_the_tool(push: PushServer) -> None:
    asked: list[dict[str, Any]] = []
    hooks = _answering({"action": "accept", "content": {"text": "Ada"}}, asked)
    outcome = _run(push.url, lambda c, d: call_on(c, d, hooks, "ask", {"question": "Your name?"}, timeout=10))
    assert _text(outcome) == "accepted: Ada"
    assert asked[0]["mode"] == "form"
    assert asked[0]["message"] == "Your name?"
    assert asked[0]["requestedSchema"]["required"] == ["text"]


@pytest.mark.parametrize(("action", "said"), [("decline", "declined"), ("cancel", "cancelled")])
def test_decline_and_cancel_reach_the_tool(push: PushServer, action: str, said: str) -> None:
    hooks = _answering({"action": action}, [])
    outcome = _run(push.url, lambda c, d: call_on(c, d, hooks, "ask", {"question": "Go?"}, timeout=10))
    assert _text(outcome) == said


def test_the_hub_limit_pauses_while_a_person_decides(push: PushServer) -> None:
    # The person takes longer than the call's own limit: the limit does not run while they decide.
    hooks = _answering({"action": "accept", "content": {"text": "slow"}}, [], delay=1.5)
    outcome = _run(push.url, lambda c, d: call_on(c, d, hooks, "ask", {"question": "Go?"}, timeout=1.0))
    assert _text(outcome) == "accepted: slow"


def test_a_limit_passing_after_the_send_is_an_unknown_outcome(push: PushServer) -> None:
    before = push.counts().get("slow", 0)
    hooks = _answering({"action": "cancel"}, [])
    with pytest.raises(PermanentError) as caught:
        _run(push.url, lambda c, d: call_on(c, d, hooks, "slow", {"seconds": 3}, timeout=0.5))
    assert caught.value.code == "outcome_unknown"
    assert "may have run" in caught.value.message
    assert push.counts()["slow"] == before + 1


def test_the_server_stopping_to_wait_cancels_the_pending_elicitation(push: PushServer) -> None:
    ended: list[str] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        try:
            await anyio.sleep(WAIT * 3)
        except anyio.get_cancelled_exc_class():
            ended.append("cancelled")
            raise
        return {"action": "decline"}

    hooks = SessionHooks(elicit=elicit)
    outcome = _run(push.url, lambda c, d: call_on(c, d, hooks, "ask", {"question": "Go?"}, timeout=30))
    assert _text(outcome) == "stopped waiting"
    assert ended == ["cancelled"]


def test_url_mode_elicitation_and_url_required(push: PushServer) -> None:
    asked: list[dict[str, Any]] = []
    hooks = _answering({"action": "accept"}, asked)

    async def both(client: Any, dispatcher: Dispatcher) -> tuple[Any, Any]:
        first = await call_on(client, dispatcher, hooks, "ask_url", {}, timeout=10)
        second = await call_on(client, dispatcher, hooks, "needs_auth", {}, timeout=10)
        return first, second

    first, second = _run(push.url, both)
    assert _text(first) == "url accept"
    assert asked[0]["mode"] == "url"
    assert asked[0]["url"] == "https://example.com/sign-in"
    assert isinstance(second, UrlRequired)
    assert second.elicitations[0]["url"] == "https://example.com/authorize"
    assert second.elicitations[0]["elicitationId"] == "auth-1"


def test_progress_reaches_the_hooks_and_calls_share_a_session(push: PushServer) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        return {"action": "cancel"}

    hooks = SessionHooks(elicit=elicit, progress=progress)

    async def two(client: Any, dispatcher: Dispatcher) -> tuple[Any, Any]:
        first = await call_on(client, dispatcher, hooks, "count_steps", {"steps": 3}, timeout=10)
        assert dispatcher.hooks is None
        second = await call_on(client, dispatcher, hooks, "echo", {"text": "again"}, timeout=10)
        return first, second

    first, second = _run(push.url, two)
    assert _text(first) == "3 steps"
    assert _text(second) == "echo: again"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


def test_an_unreachable_server_fails_to_open() -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    with pytest.raises(TransientError) as caught:
        _run(url, lambda c, d: call_on(c, d, _answering({"action": "cancel"}, []), "echo", {}, timeout=5))
    assert caught.value.code == "connect_failed"


def test_an_exception_of_the_caller_passes_through_untouched(push: PushServer) -> None:
    async def body(client: Any, dispatcher: Dispatcher) -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        _run(push.url, body)


# ---- the tool's output schema on a handshake-era session ----------------------------------------------
# The SDK checks a completed call's result against the tool's output schema. On a session that has not listed
# the tools it lists them first, after the tool has run (every new HTTP session: an extra request per call,
# whose failure lost a result already received); and a result that does not conform raised, losing it too.
# The server: the client tests' (tests/mcp_test_server.py), spoken to with the handshake; it records requests.


def _methods(server: LiveServer) -> list[str]:
    return [str((record.get("body") or {}).get("method")) for record in server.seen("/mcp")]


def _legacy_call(server: LiveServer, name: str, arguments: dict[str, Any], **kwargs: Any) -> Any:
    hooks = _answering({"action": "cancel"}, [])

    async def body(client: Any, dispatcher: Dispatcher) -> Any:
        return await call_on(client, dispatcher, hooks, name, arguments, timeout=10, **kwargs)

    async def main() -> Any:
        dispatcher = Dispatcher()
        transport, http = http_transport(server.config(), read_timeout=60, dispatcher=dispatcher)
        async with http, open_client(transport, mode="legacy", dispatcher=dispatcher, timeout=10) as client:
            return await body(client, dispatcher)

    return anyio.run(main)


def _definitions(server: LiveServer) -> dict[str, dict[str, Any]]:
    tools = {tool["name"]: tool for tool in run(list_tools(server.config()))}
    server.reset()
    return tools


def test_with_the_tools_definition_a_call_sends_nothing_but_the_call(mcp_test_server: LiveServer) -> None:
    definition = _definitions(mcp_test_server)["echo"]
    outcome = _legacy_call(mcp_test_server, "echo", {"text": "hi"}, tool=definition)
    assert isinstance(outcome, Completed) and outcome.output_schema_error is None
    assert outcome.result["structuredContent"] == {"result": "echo: hi"}
    assert _methods(mcp_test_server) == ["initialize", "notifications/initialized", "tools/call"]


def test_without_it_the_tools_are_listed_before_the_call_not_after(mcp_test_server: LiveServer) -> None:
    mcp_test_server.reset()
    outcome = _legacy_call(mcp_test_server, "echo", {"text": "hi"})
    assert isinstance(outcome, Completed)
    assert _methods(mcp_test_server) == [
        "initialize",
        "notifications/initialized",
        "tools/list",
        "tools/call",
    ]


@pytest.mark.parametrize("given", [True, False])
def test_a_result_breaking_its_output_schema_is_kept_with_the_problem_noted(
    mcp_test_server: LiveServer, given: bool
) -> None:
    definitions = _definitions(mcp_test_server)
    definition = definitions["typed_out"] if given else None
    outcome = _legacy_call(mcp_test_server, "typed_out", {}, tool=definition)
    assert isinstance(outcome, Completed)
    assert outcome.result["structuredContent"] == {"count": "not a number"}
    assert outcome.output_schema_error and "typed_out" in outcome.output_schema_error
    assert _methods(mcp_test_server).count("tools/call") == 1
