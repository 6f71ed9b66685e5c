"""What the gateway's errors repeat of what a client sent: enough to recognise it, never all of it (a request
body may hold a megabyte in one name). On real parts: the gateway process, PostgreSQL, Redis, a Celery worker,
the demo MCP server and the official Python SDK client in both eras."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from approvals.models import InputRequest, ToolCall
from tests import test_gateway as gateway_tests
from tests.test_gateway import MODES, GatewayHub, _client
from tests.test_gateway_passthrough import TOOL, _connect, _never, _requester_rule

# The gateway tests' fixtures: one gateway process for this module, a fresh hub for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


def _leaves(errors: Any) -> Iterator[BaseException]:
    for error in errors:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error.exceptions)
        else:
            yield error


def _mcp_error(error: BaseException) -> MCPError:
    found = [e for e in _leaves([error]) if isinstance(e, MCPError)]
    assert found, repr(error)
    return found[0]


@pytest.mark.parametrize("mode", MODES)
def test_an_unknown_tools_name_is_not_echoed_in_full(ghub: GatewayHub, mode: str) -> None:
    # A 2026-07-28 client repeats the name in its Mcp-Name header, which the HTTP server caps; a
    # handshake-era one only in the body.
    name = "demo__" + "x" * (200_000 if mode == "legacy" else 5_000)

    async def call() -> None:
        http, client = _client(ghub.url + "/mcp", ghub.token, mode)
        async with http, client:
            await client.call_tool(name, {})

    with pytest.raises(BaseException) as refused:
        anyio.run(call)
    error = _mcp_error(refused.value)
    assert error.error.code == types.INVALID_PARAMS
    message = error.error.message
    assert message.startswith("Unknown tool: demo__xxx") and len(message) < 300, len(message)
    assert f"{len(name)} characters" in message
    assert not ToolCall.objects.exists()


def test_an_answer_to_a_question_never_asked_is_not_echoed_in_full(ghub: GatewayHub) -> None:
    _requester_rule(ghub)
    key = "k" * 200_000

    async def run() -> MCPError:
        http, client = _connect(ghub.url + "/mcp", ghub.token, "2026-07-28", _never)
        async with http, client:
            first = await client.session.call_tool(TOOL, {"branch": "echo"}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult), first
            with pytest.raises(MCPError) as refused:
                await client.session.call_tool(
                    TOOL,
                    {"branch": "echo"},
                    input_responses={key: types.ElicitResult(action="cancel")},
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            return refused.value

    refused = anyio.run(run)
    assert refused.error.code == types.INVALID_PARAMS
    assert "which this round did not ask" in refused.error.message
    assert len(refused.error.message) < 300 and "200000 characters" in refused.error.message
    assert InputRequest.objects.get().status == InputRequest.Status.PENDING
