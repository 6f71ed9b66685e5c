"""An idempotency key reused for another call is refused and leaves the first call as it was."""

from __future__ import annotations

import pytest

from approvals.services import calls
from tests import factories

pytestmark = pytest.mark.django_db

MODERN = {"era": "2026-07-28", "modes": ["form"]}
MUTE = {"era": "handshake", "modes": []}


@pytest.fixture
def agent():
    srv = factories.server("deploy")
    ag, _ = factories.agent("ci-bot", servers=[srv])
    return ag


def submit(agent, tool: str, client: dict, arguments: dict | None = None):
    return calls.call_submit(
        agent=agent,
        server_slug="deploy",
        tool=tool,
        arguments=arguments if arguments is not None else {"branch": "main"},
        idempotency_key="deploy-1",
        channel="mcp",
        agent_client=client,
    )


def test_another_call_with_the_key_does_not_rewrite_the_first_calls_client(agent) -> None:
    """The gateway's refusal of a key reused for another tool (or other arguments) came after the first
    call's client had been replaced by the second request's: a later round of the first call was then routed
    as if its agent's client could (or could not) answer questions itself."""
    first, created = submit(agent, "create_deployment", MODERN)
    assert created
    for tool, arguments in (("drop_database", {"branch": "main"}), ("create_deployment", {"branch": "x"})):
        again, created = submit(agent, tool, MUTE, arguments)
        assert (again.pk, created) == (first.pk, False)
        assert calls.other_request(again, server_slug="deploy", tool=tool, arguments=arguments) is not None
        first.refresh_from_db()
        assert first.agent_client == MODERN


def test_a_repeat_of_the_same_call_records_its_latest_client(agent) -> None:
    first, _ = submit(agent, "create_deployment", MUTE)
    again, created = submit(agent, "create_deployment", MODERN)
    assert (again.pk, created) == (first.pk, False)
    first.refresh_from_db()
    assert first.agent_client == MODERN


def test_a_gateway_repeat_is_not_answered_with_a_call_made_for_someone(agent) -> None:
    """The gateway's repeat without a key (same tool, same arguments, within the window) found a call the
    agent had made through the API for a person: the gateway's call, made for no one, then became that
    person's call (their links, their grants, their self-approval rules), as a reused idempotency key may
    not make it."""
    erin = factories.user("erin")
    agent.acts_for_users.add(erin)
    hers, created = calls.call_submit(
        agent=agent, server_slug="deploy", tool="create_deployment", arguments={"b": 1}, on_behalf_of="erin"
    )
    assert created
    mine, created = calls.call_submit_or_repeat(
        agent=agent, server_slug="deploy", tool="create_deployment", arguments={"b": 1}, window=60
    )
    assert created and mine.pk != hers.pk and mine.on_behalf_of_id is None
    again, created = calls.call_submit_or_repeat(
        agent=agent, server_slug="deploy", tool="create_deployment", arguments={"b": 1}, window=60
    )
    assert (again.pk, created) == (mine.pk, False)  # its own repeat is still found
