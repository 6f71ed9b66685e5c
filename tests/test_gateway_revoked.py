"""A `/mcp` tools/call may wait a day on people; an agent deactivated, or given a new token, while it waits is
no longer answered there: its client gets a JSON-RPC error instead of the call's result (the call itself goes
on on the hub). On real parts: the gateway process, PostgreSQL, Redis, a Celery worker, the demo MCP server
and the official Python SDK client."""

from __future__ import annotations

import pytest

from approvals.models import AgentClient, ToolCall
from approvals.services import tokens
from tests import test_gateway as gateway_tests
from tests.live import wait_until
from tests.test_gateway import GatewayHub, _pending_call, _text, call_in_background

gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("revoke", ["deactivated", "token rotated", "still valid"])
def test_an_agent_revoked_while_its_call_waits_is_not_given_the_result(ghub: GatewayHub, revoke: str) -> None:
    outcome, thread = call_in_background(
        ghub.url + "/mcp", ghub.token, "2026-07-28", "demo__create_deployment", {"branch": "feature/rv"}
    )
    call_id = _pending_call(ghub.hub)
    wait_until(lambda: outcome.progress, 30, 0.1, what="the first progress notification")
    agent = AgentClient.objects.get(pk=ToolCall.objects.get(pk=call_id).agent_id)
    if revoke == "deactivated":
        AgentClient.objects.filter(pk=agent.pk).update(is_active=False)
    elif revoke == "token rotated":
        tokens.agent_token_rotate(agent=agent)
    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    assert ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200

    thread.join(60)
    assert not thread.is_alive()
    if revoke == "still valid":
        assert outcome.error is None and outcome.result is not None
        assert "Deployed feature/rv to staging" in _text(outcome.result)
        return
    assert outcome.result is None
    assert "deactivated or its token replaced" in repr(outcome.error)
    assert "Deployed" not in repr(outcome.error)
    # The call itself went on: the reviewer's answer was sent, and the server ran the tool.
    wait_until(lambda: ToolCall.objects.get(pk=call_id).status == "completed", 30, 0.1, what="completed")
