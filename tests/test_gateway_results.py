"""What a gateway tools/call returns for each way a call ends (pure: no database, no process)."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from approvals.gateway.catalog import CallState
from approvals.gateway.server import CALL_META_KEY, final_result, never_leaks


def state(status: str, result: Any = None, error: dict | None = None, truncated: bool = False) -> CallState:
    return CallState(
        id="c-1",
        status=status,
        is_final=True,
        result=result,
        result_truncated=truncated,
        error=error,
        waiting_for="",
    )


def text(result: types.CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, types.TextContent))


def test_a_completed_call_returns_the_servers_result_with_the_call_in_meta() -> None:
    upstream = {
        "content": [{"type": "text", "text": "Deployed"}],
        "structuredContent": {"deployment_id": "dep-1"},
        "isError": False,
        "_meta": {"server/own": 1},
    }
    result = final_result(state("completed", upstream))
    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert wire["content"] == upstream["content"]
    assert wire["structuredContent"] == {"deployment_id": "dep-1"}
    assert wire["isError"] is False
    assert wire["_meta"] == {"server/own": 1, CALL_META_KEY: {"id": "c-1", "status": "completed"}}


def test_a_servers_own_tool_error_stays_a_tool_error() -> None:
    upstream = {"content": [{"type": "text", "text": "Deployment of main declined"}], "isError": True}
    result = final_result(state("completed", upstream))
    assert result.is_error is True and text(result) == "Deployment of main declined"


def test_a_truncated_result_says_so_in_meta() -> None:
    upstream = {"content": [{"type": "text", "text": "start of a long answer"}], "isError": False}
    result = final_result(state("completed", upstream, truncated=True))
    assert result.meta is not None and result.meta[CALL_META_KEY]["result_truncated"] is True


def test_a_failed_call_is_a_tool_error_naming_the_failure() -> None:
    result = final_result(
        state("failed", error={"code": "unreachable", "message": "The server did not answer."})
    )
    assert result.is_error is True
    assert text(result) == "The call failed: The server did not answer."
    assert result.meta is not None and result.meta[CALL_META_KEY] == {"id": "c-1", "status": "failed"}


def test_an_expired_call_is_a_tool_error_with_the_deadline_and_the_servers_words() -> None:
    abandoned = final_result(
        state("expired", error={"code": "expired", "message": "No one answered in time."})
    )
    assert abandoned.is_error is True and text(abandoned) == "The call expired: No one answered in time."
    answered = final_result(
        state(
            "expired", result={"content": [{"type": "text", "text": "Used the default."}], "isError": False}
        )
    )
    assert answered.is_error is True
    assert "expired" in text(answered) and "Used the default." in text(answered)


def test_a_cancelled_call_is_a_tool_error() -> None:
    result = final_result(state("cancelled"))
    assert result.is_error is True and "cancelled" in text(result)


def test_a_result_that_is_not_a_call_tool_result_is_reported_not_raised() -> None:
    result = final_result(state("completed", {"content": "not a list"}))
    assert result.is_error is True and "not a valid CallToolResult" in text(result)


def test_an_unexpected_failure_reaches_the_agent_without_its_details() -> None:
    async def broken() -> None:
        raise RuntimeError('relation "approvals_secret" at db.internal:5432 password=hunter2')

    with pytest.raises(MCPError) as raised:
        anyio.run(never_leaks(broken))
    assert raised.value.code == types.INTERNAL_ERROR
    assert "hunter2" not in str(raised.value) and "db.internal" not in raised.value.message


def test_an_mcp_error_passes_as_it_is() -> None:
    async def unknown() -> None:
        raise MCPError(types.INVALID_PARAMS, "Unknown tool: x")

    with pytest.raises(MCPError) as raised:
        anyio.run(never_leaks(unknown))
    assert raised.value.code == types.INVALID_PARAMS and raised.value.message == "Unknown tool: x"
