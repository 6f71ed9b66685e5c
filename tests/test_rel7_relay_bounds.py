"""A relay of thousands of input requests: its 400 and its audit event stay the size of a round's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from approvals.models import AuditEvent, ToolCall
from tests import factories
from tests.hub import off_the_loop

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> Client:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client: Client, input_requests: dict) -> Any:
    body = json.dumps({"server": "deploy", "tool": "t", "input_requests": input_requests})
    return off_the_loop(client.post, "/api/v1/relays", body, content_type="application/json")


def test_thousands_of_malformed_requests_are_named_up_to_a_round_s_worth(client: Client) -> None:
    """Each malformed key was named in `fields`: a body of 20,000 keys (160 KB) got an answer of over 1 MB."""
    response = post(client, {str(i): 1 for i in range(20000)})
    assert response.status_code == 400, response.content[:300]
    assert len(response.content) < 10_000
    error = response.json()["error"]
    limit = settings.ELICIT_MAX_INPUT_REQUESTS
    assert error["code"] == "invalid_body"
    assert error["message"] == f"20000 input requests are malformed; the first {limit} are named."
    assert error["fields"] == {str(i): "must be an object with method and params" for i in range(limit)}
    assert not ToolCall.objects.exists()


def test_a_few_malformed_requests_are_each_named(client: Client) -> None:
    response = post(client, {"a": 1, "b": {"method": "m"}, "c": {"method": "m", "params": {}}})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["message"] == "Some input requests are malformed."
    assert set(error["fields"]) == {"a", "b"}


def test_a_relay_of_thousands_of_keys_is_audited_as_its_round(client: Client) -> None:
    """The round refused as a whole keeps its first keys and their count in its event; the relay's own event
    kept every key, over 100 KB of them."""
    asked = {f"key-{i}": {"method": "elicitation/create", "params": {}} for i in range(10000)}
    response = post(client, asked)
    assert response.status_code == 201, response.content[:300]
    limit = settings.ELICIT_MAX_INPUT_REQUESTS
    submitted = AuditEvent.objects.get(verb="relay.submitted").data
    assert submitted["keys"] == [f"key-{i}" for i in range(limit)]
    assert submitted["key_count"] == 10000
    opened = AuditEvent.objects.get(verb="round.opened").data
    assert opened["keys"] == submitted["keys"]
    # Every key is still answered to the agent.
    relay = ToolCall.objects.get()
    assert len(relay.input_responses or {}) == 10000


def test_a_relay_of_a_round_s_worth_of_keys_audits_each(client: Client) -> None:
    asked = {
        "env": {"method": "elicitation/create", "params": {}},
        "ok": {"method": "roots/list", "params": {}},
    }
    assert post(client, asked).status_code == 201
    submitted = AuditEvent.objects.get(verb="relay.submitted").data
    assert submitted["keys"] == ["env", "ok"]
    assert "key_count" not in submitted
