"""A round over ELICIT_MAX_INPUT_REQUESTS is refused before its requests become rows: one row says why, and
the server (or the relaying agent) still gets ``decline`` for every key it sent.

The server is the real MCP test server (tests/mcp_test_server.py, over HTTP, 2026-07-28), driven by the
hub's send path (`sending.call_send`) as a worker runs it; relays go through the HTTP API.
"""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import AuditEvent, InputRequest, McpServer, Round, ToolCall
from approvals.services import sending
from tests import factories
from tests.hub import Agent
from tests.test_mcp_client import LiveServer

pytestmark = pytest.mark.django_db


def _form(n: int) -> dict[str, Any]:
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": f"Question {n}",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }


def test_a_round_of_20000_inputs_makes_one_row_and_declines_every_key(mcp_test_server: LiveServer) -> None:
    asked = 20_000
    release = factories.team("release")
    agent, _ = factories.agent("ci-bot")
    server = McpServer.objects.create(
        slug="many",
        name="many",
        url=f"{mcp_test_server.base}/scripted/many_inputs?n={asked}",
        default_team=release,
    )
    agent.servers.add(server)
    call = factories.call(server, agent, tool="scripted", arguments={})
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED
    # The server got an answer for each of its keys, all of them decline.
    assert call.result["content"][0]["text"] == f"answered {asked}: decline"
    ir = InputRequest.objects.get(round__call=call)
    assert (ir.status, ir.action) == (InputRequest.Status.UNSUPPORTED, InputRequest.Action.DECLINE)
    assert f"{asked} inputs in one round" in ir.problem and "at most 50" in ir.problem
    assert Round.objects.filter(call=call).count() == 1
    opened = AuditEvent.objects.get(call_id=call.pk, verb="round.opened").data
    assert opened["key_count"] == asked and len(opened["keys"]) == 50


def test_a_relay_of_too_many_inputs_makes_one_row_and_declines_every_key() -> None:
    asked = 120
    _, token = factories.agent("relay-bot")
    response = Agent(token).post(
        "/relays",
        {
            "server": "elsewhere",
            "tool": "deploy",
            "arguments": {},
            "input_requests": {f"k{n}": _form(n) for n in range(asked)},
        },
    )
    assert response.status_code == 201, response.content
    call = ToolCall.objects.get(pk=response.json()["id"])
    assert call.status == ToolCall.Status.ANSWERED
    assert call.input_responses == {f"k{n}": {"action": "decline"} for n in range(asked)}
    ir = InputRequest.objects.get(round__call=call)
    assert ir.status == InputRequest.Status.UNSUPPORTED
    assert f"{asked} inputs in one round" in ir.problem
