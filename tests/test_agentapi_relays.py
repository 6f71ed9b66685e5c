"""Relays an agent hands over with requests the hub does not answer: refused per request, never a 500."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import InputRequest, ToolCall
from tests import factories
from tests.hub import Agent, off_the_loop

pytestmark = pytest.mark.django_db

ASK = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


@pytest.fixture
def agent() -> Agent:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    agent = Agent(token)
    # An unexpected fault must show as the 500 an agent gets, not as an exception in the test.
    agent.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)
    return agent


@pytest.mark.parametrize("method", [None, "", 7], ids=["absent", "empty", "not-a-string"])
def test_a_request_without_a_method_is_malformed(agent: Agent, method: object) -> None:
    """A JSON-RPC request names its method: one without is refused whole (400), with the key, not relayed
    and declined as if it were a method the hub does not support."""
    request_: dict = {"params": {"mode": "form", "message": "No method", "requestedSchema": ASK}}
    if method is not None:
        request_["method"] = method
    response = agent.post("/relays", {"server": "deploy", "tool": "t", "input_requests": {"other": request_}})
    assert response.status_code == 400, response.content
    body = response.json()["error"]
    assert body["code"] == "invalid_body"
    assert body["fields"] == {"other": "must be an object with method and params"}
    assert not ToolCall.objects.filter(kind=ToolCall.Kind.RELAY).exists()


@pytest.mark.parametrize(
    "request_",
    [
        {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}},
        {"method": "roots/list", "params": {}},
        {"method": "sampling/createMessage", "params": {"mode": "url", "url": "https://example.com/x"}},
    ],
    ids=["sampling", "roots", "sampling-url-mode"],
)
def test_a_request_other_than_elicitation_is_unsupported_not_a_server_error(
    agent: Agent, request_: dict
) -> None:
    """Docs: a request other than elicitation/create is `unsupported` and answered `decline`."""
    ok = {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "OK?", "requestedSchema": ASK},
    }
    response = agent.post(
        "/relays",
        {"server": "deploy", "tool": "t", "input_requests": {"other": request_, "ok": ok}},
    )
    assert response.status_code == 201, response.content
    relay_id = response.json()["id"]
    other = InputRequest.objects.get(round__call_id=relay_id, key="other")
    assert other.status == InputRequest.Status.UNSUPPORTED
    assert other.action == InputRequest.Action.DECLINE
    body = off_the_loop(agent.client.get, f"/api/v1/relays/{relay_id}").json()
    summary = {ir["key"]: ir for ir in body["rounds"][0]["input_requests"]}
    assert summary["other"]["status"] == "unsupported" and summary["other"]["problem"]
    assert summary["ok"]["status"] == "pending"
    assert ToolCall.objects.get(pk=relay_id).status == ToolCall.Status.AWAITING_INPUT


def test_a_relay_label_longer_than_the_hub_keeps_is_a_400_not_a_server_error(agent: Agent) -> None:
    """A relay may name a server the hub does not know; the label is kept (and audited) as a slug is."""
    ok = {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "OK?", "requestedSchema": ASK},
    }
    body = {"server": "s" * 51, "tool": "t", "input_requests": {"ok": ok}}
    response = agent.post("/relays", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_body" and error["fields"] == {"server": "at most 50 characters"}
    assert not ToolCall.objects.exists()
    created = agent.post("/relays", {**body, "server": "s" * 50})
    assert created.status_code == 201, created.content
    assert ToolCall.objects.get().server_label == "s" * 50
