"""A handshake-era client's answer to a pushed `elicitation/create` that is not an elicitation result at all
(an action MCP does not have, content that is not flat) is a wrong answer like one its schema refuses: asked
again, at most MAX_INVALID_ANSWERS times, then answered cancel for it, and the agent gets its call's
outcome. Before, the SDK's validation error escaped the wait: the agent's tools/call failed with an internal
error (and a traceback in the log) while its call sat with the question unanswered. Raw HTTP (the SDK's
client checks what it sends) to the real gateway process; PostgreSQL, Redis, a Celery worker, the demo MCP
server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from approvals.gateway.passthrough import MAX_INVALID_ANSWERS
from approvals.models import InputRequest, ToolCall
from tests import test_gateway as gateway_tests
from tests.live import wait_until
from tests.test_gateway import GatewayHub
from tests.test_gateway_passthrough import _requester_rule
from tests.test_gwy_hostile import LEGACY, SOUND

gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


def _session(client: httpx.Client, ghub: GatewayHub) -> dict[str, str]:
    """A handshake-era session whose client declares elicitation."""
    headers = {"Authorization": f"Bearer {ghub.token}", **SOUND, "MCP-Protocol-Version": LEGACY}
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
    answer = client.post(ghub.url + "/mcp", json=init, headers=headers)
    assert answer.status_code == 200, answer.text
    headers["Mcp-Session-Id"] = answer.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert client.post(ghub.url + "/mcp", json=initialized, headers=headers).status_code == 202
    return headers


@pytest.mark.parametrize(
    "answer",
    [
        {"action": "maybe"},
        {"action": "accept", "content": {"environment": {"nested": "staging"}}},
        {"content": {"environment": "staging"}},
    ],
)
def test_a_malformed_answer_is_asked_again_then_cancelled(ghub: GatewayHub, answer: dict[str, Any]) -> None:
    _requester_rule(ghub)
    asked: list[Any] = []
    final: dict[str, Any] = {}
    with httpx.Client(timeout=60) as client:
        headers = _session(client, ghub)
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "demo__create_deployment", "arguments": {"branch": "odd"}},
        }
        with client.stream("POST", ghub.url + "/mcp", json=call, headers=headers) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if not line.startswith("data: "):
                    continue
                message = json.loads(line[len("data: ") :])
                if message.get("method") == "elicitation/create":
                    asked.append(message["id"])
                    reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer}
                    sent = client.post(ghub.url + "/mcp", json=reply, headers=headers)
                    assert sent.status_code == 202, sent.text
                elif message.get("id") == 1:
                    final = message
                    break

    assert len(asked) == MAX_INVALID_ANSWERS, (asked, final)
    assert "result" in final, final
    assert final["result"]["isError"] is True
    request = InputRequest.objects.get()
    assert request.status == InputRequest.Status.ANSWERED and request.action == "cancel"
    wait_until(lambda: ToolCall.objects.get().is_final, 30, what="the call's end")
