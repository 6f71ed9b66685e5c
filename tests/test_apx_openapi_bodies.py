"""The OpenAPI document (/api/v1/openapi.json) describes the bodies the endpoints really send: each real body
validates against its operation's 200 schema, with every field it holds declared there (an undeclared field
fails, as does a declared one missing or of another type)."""

from __future__ import annotations

import copy
import uuid
from datetime import timedelta
from typing import Any

import jsonschema
import pytest
from django.test import Client
from django.utils import timezone

from approvals import selectors
from approvals.models import McpServer, Membership, Policy, RoutingRule
from approvals.services import grants, tokens
from tests import factories
from tests.hub import Agent, ApiClient, Reviewer

pytestmark = pytest.mark.django_db

QUESTION = {
    "method": "elicitation/create",
    "params": {
        "message": "Which environment?",
        "requestedSchema": {"type": "object", "properties": {"environment": {"type": "string"}}},
    },
}
LINK = {
    "method": "elicitation/create",
    "params": {"mode": "url", "message": "Sign in", "url": "https://example.com/auth", "elicitationId": "e1"},
}


def _closed(schema: Any) -> Any:
    """The schema with every object of declared properties closed to others."""
    if isinstance(schema, dict):
        closed = {key: _closed(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return Client().get("/api/v1/openapi.json").json()


def conforms(document: dict[str, Any], method: str, path: str, response: Any) -> Any:
    """The body of `response` (a 200), checked against the document's 200 schema of `method` `path`."""
    assert response.status_code == 200, response.content
    declared = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    schema = _closed({**copy.deepcopy(declared), "components": document["components"]})
    body = response.json()
    # The document names the fields (an open object, as it said of every body before, names none).
    top = declared["items"] if declared.get("type") == "array" else declared
    assert "$ref" in top, f"the document names no field of {method.upper()} {path}'s body"
    named = document["components"]["schemas"][top["$ref"].rsplit("/", 1)[-1]]["properties"]
    assert all(set(item) <= set(named) for item in (body if isinstance(body, list) else [body]))
    jsonschema.Draft202012Validator(schema).validate(body)
    return body


@pytest.fixture
def hub() -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        default_team=release,
        tools=[
            {
                "name": "deploy",
                "inputSchema": {"type": "object", "properties": {"environment": {"type": "string"}}},
            }
        ],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(
        position=1,
        name="gate deploys",
        server=server,
        tool_pattern="deploy",
        gate=True,
        team=release,
        policy=Policy.objects.create(name="one", extend_by=600),
    )
    agent, agent_token = tokens.agent_create(name="ci-bot", servers=[server])
    _, reviewer_token = tokens.personal_token_create(user=alice)
    return Agent(agent_token), Reviewer(reviewer_token), agent, alice, server


def test_calls_relays_and_their_cancels_send_what_the_document_says(document, hub) -> None:
    agent, reviewer, *_ = hub
    call = agent.post("/calls", {"server": "deploy", "tool": "other_tool", "arguments": {"a": [1]}})
    body = conforms(document, "get", "/api/v1/calls/{call_id}", agent.get(f"/calls/{call.json()['id']}"))
    assert body["rounds"] == [] and body["gate"] is None
    gated = agent.call("deploy", {"environment": "staging"}, server="deploy")
    body = conforms(document, "get", "/api/v1/calls/{call_id}", agent.get(f"/calls/{gated}"))
    assert body["gate"]["status"] == "open" and body["rounds"][0]["input_requests"]
    body = conforms(
        document, "post", "/api/v1/calls/{call_id}/cancel", agent.post(f"/calls/{gated}/cancel", {})
    )
    assert body["status"] == "cancelled" and body["gate"]["status"] == "cancelled"
    assert "answered_at" in body["rounds"][0]["input_requests"][0]

    relay = agent.post(
        "/relays",
        {"server": "deploy", "tool": "t", "input_requests": {"environment": QUESTION, "link": LINK}},
    ).json()["id"]
    body = conforms(document, "get", "/api/v1/relays/{relay_id}", agent.get(f"/relays/{relay}"))
    assert body["input_responses"] is None
    for item in reviewer.inbox():
        if item["call"] == relay:
            content = {"environment": "prod"} if item["mode"] == "form" else None
            assert reviewer.respond(item["id"], content=content).status_code == 200
    body = conforms(document, "get", "/api/v1/relays/{relay_id}", agent.get(f"/relays/{relay}"))
    assert body["status"] == "answered" and set(body["input_responses"]) == {"environment", "link"}
    other = agent.post("/relays", {"server": "deploy", "tool": "t", "input_requests": {"e": QUESTION}}).json()
    cancelled = agent.post(f"/relays/{other['id']}/cancel", {})
    assert conforms(document, "post", "/api/v1/relays/{relay_id}/cancel", cancelled)["status"] == "cancelled"


def test_the_inbox_and_the_answers_send_what_the_document_says(document, hub) -> None:
    agent, reviewer, *_ = hub
    agent.call("deploy", {"environment": "staging"}, server="deploy")
    agent.post(
        "/relays",
        {"server": "deploy", "tool": "t", "input_requests": {"environment": QUESTION, "link": LINK}},
    )
    items = conforms(document, "get", "/api/v1/inbox", reviewer.get("/inbox"))
    assert {item["mode"] for item in items} == {"form", "url"}
    assert any("gate" in item for item in items) and any("url" in item for item in items)
    gate = next(item for item in items if "gate" in item)
    extended = reviewer.post(f"/input-requests/{gate['id']}/extend", {})
    assert conforms(document, "post", "/api/v1/input-requests/{request_id}/extend", extended)["deadline"]
    decided = reviewer.post(f"/input-requests/{gate['id']}/decide", {"decision": "decline", "reason": "no"})
    assert conforms(document, "post", "/api/v1/input-requests/{request_id}/decide", decided)["action"]
    link = next(item for item in items if item["mode"] == "url")
    answered = reviewer.respond(link["id"], action="decline")
    conforms(document, "post", "/api/v1/input-requests/{request_id}/respond", answered)


def test_grants_send_what_the_document_says(document, hub) -> None:
    _, reviewer, agent_row, alice, server = hub
    made = factories.call(server, agent_row, tool="deploy", arguments={"environment": "staging"})
    grant = grants.create_from_approval(
        approver=alice, call=made, tool_digest="d" * 64, choice={"for": "8h", "arguments": "exact"}
    )
    listed = conforms(document, "get", "/api/v1/grants", reviewer.get("/grants"))
    assert [item["id"] for item in listed] == [str(grant.pk)]
    revoked = ApiClient.post(reviewer, f"/grants/{grant.pk}/revoke", {})
    assert conforms(document, "post", "/api/v1/grants/{grant_id}/revoke", revoked)["state"] == "revoked"


def test_a_grant_reads_the_clock_once_for_its_state_and_whether_it_lets_calls_through(
    hub, monkeypatch
) -> None:
    """A grant read as its expiry passes is active and lets calls through, or expired and lets none: never
    "active" and letting nothing through, which says its grantor could no longer make it."""
    _, _, agent_row, alice, server = hub
    made = factories.call(server, agent_row, tool="deploy", arguments={"environment": "staging"})
    grant = grants.create_from_approval(
        approver=alice, call=made, tool_digest="d" * 64, choice={"for": "1h", "arguments": "exact"}
    )
    ticks = iter([grant.expires_at - timedelta(microseconds=1), grant.expires_at])
    monkeypatch.setattr(timezone, "now", lambda: next(ticks))
    item = selectors.grant_item(grant)
    assert (item["state"], item["lets_calls_through"]) == ("active", True)


def test_error_bodies_are_the_documents_error_shape(document, hub) -> None:
    """Each error, with `fields` or without, validates against ErrorOut: `fields` is left out, never null."""
    agent, reviewer, *_ = hub
    schema = _closed({"$ref": "#/components/schemas/ErrorOut", "components": document["components"]})
    validator = jsonschema.Draft202012Validator(schema)
    errors = [
        agent.post("/calls", {"server": "deploy"}),  # 400, with fields
        agent.get(f"/calls/{uuid.uuid4()}"),  # 404
        agent.client.put("/api/v1/calls"),  # 405
        reviewer.post("/calls", {"server": "deploy", "tool": "t"}),  # 403
        Client().get("/api/v1/inbox"),  # 401
    ]
    assert [response.status_code for response in errors] == [400, 404, 405, 403, 401]
    for response in errors:
        validator.validate(response.json())
    assert "fields" in errors[0].json()["error"] and "fields" not in errors[1].json()["error"]
