"""How a `/mcp` tools/call waits, on real parts: the gateway process, PostgreSQL, Redis, a Celery worker, the
demo MCP server and the official Python SDK client.

A question a routing rule passes through to the requester stays open while the agent's client cannot answer
it (a repeat of the call from a client without the elicitation capability): that client waits as for any
other question, a progress notification per interval, and is not spun on the open question.
"""

from __future__ import annotations

import anyio
import mcp_types as types
import pytest

from approvals.models import InputRequest, ToolCall
from tests import test_gateway as gateway_tests
from tests.live import wait_until
from tests.test_gateway import GatewayHub, _text, call_in_background
from tests.test_gateway_passthrough import TOOL, _connect, _never, _requester_rule

# The gateway tests' fixtures: one gateway process for this module (progress every second), a fresh hub
# for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


def test_a_repeat_that_cannot_answer_the_requesters_question_waits_without_spinning(
    ghub: GatewayHub,
) -> None:
    _requester_rule(ghub)

    async def ask() -> types.CallToolResult | types.InputRequiredResult:
        http, client = _connect(ghub.url + "/mcp", ghub.token, "2026-07-28", _never)
        async with http, client:
            return await client.session.call_tool(TOOL, {"branch": "spin"}, allow_input_required=True)

    first = anyio.run(ask)
    assert isinstance(first, types.InputRequiredResult), first
    call = ToolCall.objects.get()
    assert InputRequest.objects.get(round__call=call).for_requester

    # The same call from a client that declared no elicitation capability: it re-attaches and waits.
    outcome, thread = call_in_background(
        ghub.url + "/mcp", ghub.token, "2026-07-28", TOOL, {"branch": "spin"}
    )
    wait_until(lambda: outcome.progress, 30, 0.05, what="progress on the repeated call")
    assert "waiting for the requester" in (outcome.progress[0][1] or "")
    assert ghub.hub.agent.post(f"/calls/{call.pk}/cancel", {}).status_code == 200
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert outcome.result is not None and "cancelled" in _text(outcome.result)
    assert ToolCall.objects.count() == 1
    # The gateway waited on the call (a notification a second, ELICIT_GATEWAY_PROGRESS_INTERVAL here)
    # between the first notification and the cancel, instead of reading and notifying in a loop.
    assert len(outcome.progress) <= 5, len(outcome.progress)
