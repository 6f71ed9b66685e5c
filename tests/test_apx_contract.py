"""The HTTP contract (docs/api.md) as the OpenAPI document states it and the endpoints keep it."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.models import InputRequest, Membership, ToolCall
from approvals.services import tokens
from tests import factories
from tests.hub import Agent, Reviewer

pytestmark = pytest.mark.django_db

QUESTION = {
    "method": "elicitation/create",
    "params": {
        "message": "Which environment?",
        "requestedSchema": {"type": "object", "properties": {"environment": {"type": "string"}}},
    },
}


def openapi() -> dict[str, Any]:
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()["error"]
    assert body["code"] == code and body["message"]
    return body


@pytest.fixture
def agent() -> Agent:
    deploy = factories.server("deploy")
    alice = factories.user("alice")
    deploy.default_team = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy.save()
    _, token = factories.agent("ci-bot", servers=[deploy])
    return Agent(token)


@pytest.fixture
def reviewer(agent: Agent) -> Reviewer:
    _, token = tokens.personal_token_create(user=get_user_model().objects.get(username="alice"))
    return Reviewer(token)


def test_the_openapi_document_lists_the_405_every_address_answers_with_the_error_shape(agent: Agent) -> None:
    """docs/api.md: the document lists every error status of the table, 405 `method_not_allowed` too."""
    paths = openapi()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            declared = operation["responses"].get("405")
            assert declared is not None, f"{method.upper()} {path} does not list its 405"
            schema = declared["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorOut"}
    response = agent.client.delete("/api/v1/calls")
    body = assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "POST" and set(body) == {"code", "message"}


def test_a_relays_server_is_limited_as_the_openapi_document_says(agent: Agent) -> None:
    """The document said 200 characters for a relay's `server`; the hub takes 50 (the audit log's slug)."""
    limit = openapi()["components"]["schemas"]["RelayIn"]["properties"]["server"]["maxLength"]
    assert limit == 50
    body = {"tool": "create_deployment", "input_requests": {"environment": QUESTION}}
    too_long = agent.post("/relays", {**body, "server": "x" * (limit + 1)})
    assert "server" in assert_error(too_long, 400, "invalid_body")["fields"]
    assert not ToolCall.objects.exists()
    assert agent.post("/relays", {**body, "server": "x" * limit}).status_code == 201


@pytest.mark.parametrize("state", ["forever", "x" * 21, "active" * 10])
def test_any_unknown_grant_state_is_an_invalid_query(reviewer: Reviewer, state: str) -> None:
    """docs/api.md: an unknown `state` is a 400 `invalid_query`, however long it is."""
    body = assert_error(reviewer.get("/grants", state=state), 400, "invalid_query")
    assert body["fields"] == {"state": "invalid"}


def test_a_null_reason_is_a_reason_not_given(agent: Agent, reviewer: Reviewer) -> None:
    """`reason` is optional: a client that sends an absent field as null declines without one."""
    relay = agent.post(
        "/relays", {"server": "deploy", "tool": "t", "input_requests": {"environment": QUESTION}}
    )
    assert relay.status_code == 201, relay.content
    (item,) = reviewer.inbox()
    response = reviewer.post(f"/input-requests/{item['id']}/respond", {"action": "decline", "reason": None})
    assert response.status_code == 200, response.content
    assert response.json() == {"id": item["id"], "status": "answered", "action": "decline"}
    assert InputRequest.objects.get(pk=item["id"]).action == "decline"
    reason = openapi()["components"]["schemas"]["RespondIn"]["properties"]["reason"]
    assert reason["type"] == "string" and reason["maxLength"] == 2000
    over = reviewer.post(f"/input-requests/{item['id']}/respond", {"action": "decline", "reason": "r" * 2001})
    assert_error(over, 409, "already_answered")  # decided already: told first, whatever the reason's length
    decide = json.dumps({"decision": "decline", "reason": None})
    gone = reviewer.post(f"/input-requests/{uuid.uuid4()}/decide", decide)
    assert_error(gone, 404, "not_found")  # the body was taken: a gate that is not there
