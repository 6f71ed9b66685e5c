"""A completed call's result as the agent's client version allows it. A 2026-07-28 upstream may answer
`structuredContent` that is not an object (any JSON value since 2026-07-28); the handshake era allows only
an object, and the SDK refused the whole result on the way out: a handshake-era agent got a bare
"Handler returned an invalid result" (-32603) for a call that ran, and the same again on every repeat. Now the
value goes as text (unless a text item already holds it) and the call's id stays in `_meta`.

Pure checks of `final_result`, then the real gateway process and the official SDK client in both eras."""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
import pytest
from django.utils import timezone

from approvals.gateway.catalog import CallState
from approvals.gateway.server import CALL_META_KEY, final_result
from approvals.models import ToolCall
from tests import test_gateway as gateway_tests
from tests.test_gateway import MODES, GatewayHub, _client, _text

gateway = gateway_tests.gateway
gateway_process = gateway_tests.gateway_process
ghub = gateway_tests.ghub


def _state(result: Any) -> CallState:
    return CallState(
        id="c-1",
        status="completed",
        is_final=True,
        result=result,
        result_truncated=False,
        error=None,
        waiting_for="",
    )


def _texts(result: types.CallToolResult) -> list[str]:
    return [item.text for item in result.content if isinstance(item, types.TextContent)]


@pytest.mark.parametrize("value", [[1, 2, 3], "plain", 42, None])
def test_structured_content_a_handshake_client_cannot_take_goes_as_text(value: Any) -> None:
    upstream = {"content": [], "structuredContent": value, "isError": False}
    modern = final_result(_state(upstream), "2026-07-28")
    assert modern.structured_content == value if value is not None else modern.structured_content is None
    for version in ("2025-06-18", "2025-11-25"):
        result = final_result(_state(upstream), version)
        wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        assert "structuredContent" not in wire or isinstance(wire["structuredContent"], dict)
        assert result.is_error is False
        if value is not None:
            assert json.loads(_texts(result)[-1]) == value
        assert result.meta is not None and result.meta[CALL_META_KEY]["id"] == "c-1"


def test_a_text_item_already_holding_the_value_is_not_repeated() -> None:
    upstream = {
        "content": [{"type": "text", "text": "[1, 2]"}],
        "structuredContent": [1, 2],
        "isError": False,
    }
    result = final_result(_state(upstream), "2025-11-25")
    assert _texts(result) == ["[1, 2]"] and result.structured_content is None


def test_an_object_result_is_untouched_in_every_era() -> None:
    upstream = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"a": 1}, "isError": False}
    for version in ("2025-06-18", "2025-11-25", "2026-07-28", None):
        result = final_result(_state(upstream), version)
        assert result.structured_content == {"a": 1} and _texts(result) == ["ok"]


# --- on the real gateway ----------------------------------------------------------------------------------


async def _call(
    url: str, token: str, mode: str, name: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    http, client = _client(url, token, mode)
    async with http, client:
        return await client.call_tool(name, arguments)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", MODES)
def test_a_handshake_era_agent_gets_the_result_of_a_call_that_ran(ghub: GatewayHub, mode: str) -> None:
    agent = ghub.hub.server.agents.get()
    arguments = {"branch": f"gaterev-{mode}"}
    # The call ran moments ago (its agent lost the answer): a repeat of it gets its result, not a new run.
    done = ToolCall.objects.create(
        server=ghub.hub.server,
        agent=agent,
        tool="create_deployment",
        arguments=arguments,
        status=ToolCall.Status.COMPLETED,
        finished_at=timezone.now(),
        result={"content": [], "structuredContent": ["dep-1", "dep-2"], "isError": False},
    )
    result = anyio.run(_call, ghub.url + "/mcp", ghub.token, mode, "demo__create_deployment", arguments)
    assert result.is_error is False
    assert result.meta is not None and result.meta[CALL_META_KEY]["id"] == str(done.pk)
    if mode == "legacy":
        assert json.loads(_text(result)) == ["dep-1", "dep-2"]
    else:
        assert result.structured_content == ["dep-1", "dep-2"]
    assert ToolCall.objects.filter(agent=agent, arguments=arguments).count() == 1
