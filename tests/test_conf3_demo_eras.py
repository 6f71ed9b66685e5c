"""The demo MCP server's tools on a handshake-era session (2025-11-25): the same questions arrive as
`elicitation/create` (and `sampling/createMessage`, `roots/list`) in the middle of the call, answered on
the session, while a 2026-07-28 client still gets `input_required` as a JSON answer. Driven over real HTTP
by the official SDK client (mode "legacy" is the `initialize` handshake)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import mcp
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolResult,
    CreateMessageResult,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    ListRootsResult,
    Root,
    TextContent,
)

from approvals.models import McpServer
from tests.demo_support import executions
from tests.hub import set_up_handshake_hub
from tests.live import HolderRunner, child_env, wait_until


def legacy_call(
    url: str, tool: str, arguments: dict[str, Any], answers: list[ElicitResult], **callbacks: Any
) -> tuple[CallToolResult | MCPError, list[Any]]:
    """Call `tool` on a handshake-era session, answering each elicitation with the next of `answers`; the
    outcome and the elicitation params the server sent, in order."""
    asked: list[Any] = []

    async def elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params)
        return answers[len(asked) - 1]

    async def run() -> CallToolResult | MCPError:
        async with mcp.Client(url, mode="legacy", elicitation_callback=elicit, **callbacks) as client:
            assert client.session.protocol_version == "2025-11-25"
            try:
                return await client.call_tool(tool, arguments)
            except MCPError as error:  # raised out of the `async with`, it would arrive in an ExceptionGroup
                return error

    return anyio.run(run), asked


def text_of(result: CallToolResult | MCPError) -> str:
    assert isinstance(result, CallToolResult), result
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


def test_a_production_deployment_asks_twice_over_the_session_and_deploys_once(url: str) -> None:
    answers = [
        ElicitResult(action="accept", content={"environment": "production"}),
        ElicitResult(action="accept", content={"confirm": True}),
    ]

    result, asked = legacy_call(url, "create_deployment", {"branch": "main"}, answers)

    assert text_of(result) == "Deployed main to production"
    assert [type(params) for params in asked] == [ElicitRequestFormParams, ElicitRequestFormParams]
    assert asked[0].requested_schema["required"] == ["environment"]
    assert "Deploy main to PRODUCTION?" in asked[1].message
    assert executions(url) == {"create_deployment": 1}


def test_an_unusable_answer_is_asked_again_and_a_decline_deploys_nothing(url: str) -> None:
    answers = [
        ElicitResult(action="accept", content={"environment": "qa"}),
        ElicitResult(action="decline"),
    ]

    result, asked = legacy_call(url, "create_deployment", {"branch": "main"}, answers)

    assert isinstance(result, CallToolResult) and result.is_error
    assert "declined by the reviewer" in text_of(result)
    assert "'qa' is not one of the choices" in asked[1].message
    assert executions(url) == {}


def test_a_url_request_carries_the_elicitation_id_the_handshake_era_requires(url: str) -> None:
    result, asked = legacy_call(
        url, "connect_account", {"service": "GitHub"}, [ElicitResult(action="accept")]
    )

    assert text_of(result) == "Connected GitHub"
    assert len(asked) == 1 and isinstance(asked[0], ElicitRequestURLParams)
    assert asked[0].url.startswith("https://accounts.example.com/connect/GitHub?attempt=")
    assert asked[0].elicitation_id


def test_sampling_and_roots_are_requested_on_the_session_too(url: str) -> None:
    async def sample(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="Hi"), model="test"
        )

    async def roots(context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri="file:///srv/shared")])

    result, _ = legacy_call(
        url,
        "test_input_required_result_multiple_inputs",
        {},
        [ElicitResult(action="accept", content={"name": "Ada"})],
        sampling_callback=sample,
        list_roots_callback=roots,
    )

    assert text_of(result) == "Every input answered: Hi Ada (1 roots)."


def test_a_modern_client_still_gets_input_required_as_json_without_a_session(url: str) -> None:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    }
    response = httpx.post(
        url,
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "create_deployment", "arguments": {"branch": "main"}, "_meta": meta},
        },
        headers={
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": "create_deployment",
        },
        timeout=30,
    )

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in response.headers
    assert response.json()["result"]["resultType"] == "input_required"


# ---- through the hub: the demo server registered in the handshake era, its calls held by a holder -----


@pytest.fixture
def holder(live_db: None) -> Iterator[HolderRunner]:
    runner = HolderRunner(child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1")).start()
    try:
        yield runner
    finally:
        runner.stop()


@pytest.mark.django_db(transaction=True)
def test_the_hub_serves_the_demo_in_the_handshake_era_through_a_holder(
    url: str, live_db: None, holder: HolderRunner
) -> None:
    hub = set_up_handshake_hub(url, slug="demo-handshake")
    McpServer.objects.filter(pk=hub.server.pk).update(call_timeout=120)  # room for a loaded machine

    call_id = hub.agent.call("create_deployment", {"branch": "main"}, server="demo-handshake")
    # The hub sends a held call with an Idempotency-Key: the demo must not hold back its event stream.
    asked = hub.reviewer.wait_for_request(call_id, "elicitation", timeout=90)
    assert "Which environment should main be deployed to?" in asked["message"]
    assert hub.reviewer.respond(asked["id"], "accept", {"environment": "staging"}).status_code == 200

    def ended() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    call = wait_until(ended, 90, 0.2, what="the held call to end")
    assert call["status"] == "completed", call
    assert call["result"]["content"][0]["text"] == "Deployed main to staging"
    assert executions(url) == {"create_deployment": 1}
