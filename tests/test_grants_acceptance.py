"""Issue 14's acceptance for grants, on the real stack (PostgreSQL, Redis, a Celery worker, the demo MCP
server, the /mcp gateway): the same call under a grant goes through without a person, audited as granted,
over the REST API and through /mcp with the official Python SDK client; revoking stops the next one (it
stops at a gate again)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from approvals.models import AuditEvent, Grant, RoutingRule, Team, ToolCall
from approvals.services import servers
from tests import demo_support
from tests.hub import Hub, set_up_hub
from tests.live import wait_until
from tests.test_gateway import (  # the gateway process and its hub, as the gateway's own tests use them
    GatewayHub,
    _text,
    call_in_background,
    gateway,
    gateway_process,
    ghub,
)

__all__ = ["gateway", "gateway_process", "ghub"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(180)

TOOL = "create_deployment"
ARGUMENTS = {"branch": "main", "environment": "staging"}


def gate_destructive_tools(hub: Hub) -> RoutingRule:
    return RoutingRule.objects.create(
        position=1,
        name="destructive needs approval",
        server=hub.server,
        tool_pattern="*",
        destructive=True,
        gate=True,
        team=Team.objects.get(slug="release"),
    )


def gate_item(hub: Hub, call_id: str) -> dict[str, Any]:
    return hub.reviewer.wait_for_request(call_id, "gate")


def sent_arguments(url: str) -> list[dict[str, Any]]:
    return [
        r["body"]["params"]["arguments"]
        for r in demo_support.recorded_requests(url)
        if isinstance(r.get("body"), dict)
        and r["body"].get("method") == "tools/call"
        and r["body"]["params"].get("name") == TOOL
    ]


def granted_events(call_id: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(call_id=call_id, verb="gate.granted"))


@pytest.fixture
def hub(worker, demo_server) -> Hub:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)  # the real tool list: create_deployment is destructive
    gate_destructive_tools(hub)
    return hub


def test_over_rest_a_granted_call_goes_through_without_a_person_and_revoking_stops_the_next(
    hub: Hub, demo_server
) -> None:
    first = hub.agent.call(TOOL, ARGUMENTS)
    item = gate_item(hub, first)
    response = hub.reviewer.post(
        f"/input-requests/{item['id']}/decide",
        {"decision": "approve", "grant": {"for": "8h", "arguments": "exact"}},
    )
    assert response.status_code == 200, response.content
    assert hub.agent.wait(first)["status"] == "completed"
    grant = Grant.objects.get()
    assert grant.granted_by.get_username() == "alice" and grant.source_call_id == uuid.UUID(first)
    assert AuditEvent.objects.filter(verb="grant.created", call_id=first).count() == 1

    # The same call again (its keys in another order): no gate, no person, sent once, audited as granted.
    again = hub.agent.call(TOOL, {"environment": "staging", "branch": "main"})
    done = hub.agent.wait(again)
    assert done["status"] == "completed", done
    assert done["gate"] is None  # no gate was opened for it
    assert not [i for i in hub.reviewer.inbox() if i["call"] == again]
    [event] = granted_events(again)
    assert event.data["grant"] == str(grant.pk) and event.actor_type == "system" and event.tool == TOOL
    grant.refresh_from_db()
    assert grant.uses == 1
    assert sent_arguments(demo_server.url) == [ARGUMENTS, ARGUMENTS]

    # Other arguments are not covered: a gate opens.
    other = hub.agent.call(TOOL, {"branch": "hotfix", "environment": "staging"})
    assert gate_item(hub, other)["gate"]["arguments"] == {"branch": "hotfix", "environment": "staging"}

    # Revoked over the API: the next identical call stops at a gate again and nothing is sent.
    assert hub.reviewer.post(f"/grants/{grant.pk}/revoke", {}).status_code == 200
    after = hub.agent.call(TOOL, ARGUMENTS)
    assert gate_item(hub, after)["gate"]["arguments"] == ARGUMENTS
    assert ToolCall.objects.get(pk=after).status == "awaiting_input"
    assert granted_events(after) == []
    assert len(sent_arguments(demo_server.url)) == 2


def test_through_mcp_a_granted_call_returns_the_result_without_a_person_and_revoking_stops_the_next(
    ghub: GatewayHub, demo_server
) -> None:
    hub = ghub.hub
    gate_destructive_tools(hub)
    url, name = ghub.url + "/mcp", f"demo__{TOOL}"
    # Each call carries its own Idempotency-Key: the gateway would otherwise re-attach an identical repeat.
    outcome, thread = call_in_background(url, ghub.token, "legacy", name, ARGUMENTS, key="first")
    call_id = wait_until(
        lambda: next((i["call"] for i in hub.reviewer.inbox() if i["key"] == "gate"), None),
        30,
        0.1,
        what="a gate",
    )
    item = gate_item(hub, call_id)  # type: ignore[arg-type]
    choice = {
        "for": "1h",
        "arguments": "conditions",
        "conditions": [{"argument": "environment", "value": "staging"}],
    }
    assert (
        hub.reviewer.post(
            f"/input-requests/{item['id']}/decide", {"decision": "approve", "grant": choice}
        ).status_code
        == 200
    )
    thread.join(60)
    assert outcome.error is None and outcome.result is not None and not outcome.result.is_error

    # Another branch to staging meets the grant's condition: the client gets the result, no one was asked.
    outcome, thread = call_in_background(
        url, ghub.token, "legacy", name, {"branch": "feature/x", "environment": "staging"}, key="second"
    )
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert outcome.result is not None and outcome.result.is_error is False
    assert "Deployed feature/x to staging" in _text(outcome.result)
    granted_id = outcome.result.meta["elicit-hub/call"]["id"]
    assert [e.data["grant"] for e in granted_events(granted_id)] == [str(Grant.objects.get().pk)]
    assert AuditEvent.objects.get(call_id=granted_id, verb="call.submitted").data["channel"] == "mcp"
    assert not AuditEvent.objects.filter(call_id=granted_id, verb="gate.opened").exists()

    # Revoked: the next such call waits at a gate for a person.
    grant = Grant.objects.get()
    assert hub.reviewer.post(f"/grants/{grant.pk}/revoke", {}).status_code == 200
    outcome, thread = call_in_background(
        url, ghub.token, "legacy", name, {"branch": "feature/y", "environment": "staging"}, key="third"
    )
    waiting = wait_until(
        lambda: next((i for i in hub.reviewer.inbox() if i["key"] == "gate"), None),
        30,
        0.1,
        what="a new gate",
    )
    assert waiting["gate"]["arguments"] == {"branch": "feature/y", "environment": "staging"}  # type: ignore[index]
    assert thread.is_alive()  # the client still waits
    assert (
        hub.reviewer.post(
            f"/input-requests/{waiting['id']}/decide", {"decision": "decline", "reason": "revoked"}
        ).status_code
        == 200
    )  # type: ignore[index]
    thread.join(60)
    assert outcome.result is not None and outcome.result.is_error is True
    assert demo_support.executions(demo_server.url).get(TOOL) == 2
