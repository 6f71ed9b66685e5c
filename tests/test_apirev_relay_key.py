"""A relay's idempotency_key repeats that relay and no other: the input requests are the relay's request.

Another set of questions under the same key must not be answered with the answers to the first one (the
agent would act on a person's answer to a question it never showed them)."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ToolCall
from approvals.services import calls
from tests import factories
from tests.hub import Agent

pytestmark = pytest.mark.django_db


def ask(message: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = schema or {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": schema},
    }


CONFIRM = {"confirm": ask("Deploy main to staging?")}
RELAY: dict[str, Any] = {
    "server": "deploy",
    "tool": "create_deployment",
    "arguments": {"branch": "main"},
    "input_requests": CONFIRM,
    "idempotency_key": "relay-1",
}


@pytest.fixture
def agent() -> Agent:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    return Agent(token)


@pytest.mark.parametrize(
    "input_requests",
    [
        {"confirm": ask("Drop the production database?")},
        {
            "confirm": ask(
                "Deploy main to staging?", {"type": "object", "properties": {"n": {"type": "integer"}}}
            )
        },
        {"other": ask("Deploy main to staging?")},
        {"confirm": ask("Deploy main to staging?"), "also": ask("And production?")},
    ],
    ids=["message", "schema", "key", "one-more"],
)
def test_a_relay_key_given_with_other_input_requests_is_refused(
    agent: Agent, input_requests: dict[str, Any]
) -> None:
    first = agent.post("/relays", RELAY)
    assert first.status_code == 201, first.content
    again = agent.post("/relays", {**RELAY, "input_requests": input_requests})
    assert again.status_code == 409, again.content
    error = again.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["fields"] == {"idempotency_key": "already used for another request"}
    assert "other input requests" in error["message"]
    assert ToolCall.objects.count() == 1


def test_the_same_relay_again_with_its_key_still_repeats_it(agent: Agent) -> None:
    first = agent.post("/relays", RELAY)
    # The same requests with their members in another order are the same request.
    reordered = {"confirm": {"params": CONFIRM["confirm"]["params"], "method": "elicitation/create"}}
    again = agent.post("/relays", {**RELAY, "input_requests": reordered})
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json() == first.json()


def test_a_relay_too_large_to_keep_whole_is_compared_by_what_was_kept(agent: Agent) -> None:
    """A round refused as a whole (over ELICIT_MAX_INPUT_REQUESTS) keeps only its size and keys: the same
    requests still repeat it, others of another size or keys do not."""
    many = {f"k{i}": ask(f"Question {i}") for i in range(60)}
    first = agent.post("/relays", {**RELAY, "input_requests": many})
    assert first.status_code == 201, first.content
    assert agent.post("/relays", {**RELAY, "input_requests": many}).status_code == 200
    fewer = {key: value for key, value in many.items() if key != "k59"}
    assert agent.post("/relays", {**RELAY, "input_requests": fewer}).status_code == 409


def test_other_request_without_input_requests_compares_as_before() -> None:
    """The gateway compares calls only (it makes no relays): no input requests, no change."""
    ag, _ = factories.agent("ci-bot", servers=[factories.server("deploy")])
    call, created = calls.relay_submit(
        agent=ag, server_slug="deploy", tool="t", arguments={}, input_requests=CONFIRM
    )
    assert created
    assert calls.other_request(call, server_slug="deploy", tool="t", arguments={}) is None
