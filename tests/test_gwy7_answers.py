"""A 2026-07-28 retry answering two questions of one round, one of them wrongly, records neither: the error
names the refused one, and the person may still change the other before the retry that records both. Before,
the first answer was kept (it was recorded before the second was checked) and a corrected retry that
changed it was refused as no longer pending. `passthrough.record_responses` on PostgreSQL; the boundary that
seals the state is the SDK's (its own tests, and tests/test_gateway_passthrough.py end to end)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
import pytest
from django.db import connection
from django.utils import timezone
from mcp.shared.exceptions import MCPError

from approvals.gateway import passthrough
from approvals.gateway.names import gateway_name
from approvals.models import InputRequest, Membership, Round, RoutingRule, ToolCall
from approvals.services.rounds import round_open
from tests import factories

# Committed: the retry reads in its own event loop, on a connection of its own.
pytestmark = pytest.mark.django_db(transaction=True)

FORM = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Which environment?",
        "requestedSchema": factories.ENVIRONMENT_SCHEMA,
    },
}


async def _db(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """As the gateway's: the connection is closed after each read (this event loop's own, else left open)."""
    try:
        return fn(*args, **kwargs)
    finally:
        connection.close()


def _answer(environment: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"environment": environment})


def test_one_refused_answer_records_none_of_the_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the ORM in this test's own event loop
    alice = factories.user("alice")
    team = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server(default_team=team)
    agent, _ = factories.agent(servers=[server])
    RoutingRule.objects.create(
        name="requester picks", server=server, team=team, answered_by=RoutingRule.AnsweredBy.REQUESTER
    )
    call = factories.call(server, agent, agent_client={"era": "2026-07-28", "modes": ["form"]})
    round_open(
        call=call,
        input_requests={"first": FORM, "second": FORM},
        raw={"resultType": "input_required"},
        request_state="upstream-secret",
        received_at=timezone.now(),
    )
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.AWAITING_INPUT)
    rnd = Round.objects.get(call=call)
    state = json.dumps({"call": str(call.pk), "round": rnd.pk})
    name = gateway_name(server.slug, call.tool)

    def record(responses: dict[str, types.ElicitResult]) -> str:
        return anyio.run(passthrough.record_responses, _db, agent, state, responses, name, None)

    with pytest.raises(MCPError) as refused:
        record({"first": _answer("staging"), "second": _answer("moon")})
    assert refused.value.error.code == types.INVALID_PARAMS
    assert "'second'" in refused.value.error.message
    assert set(InputRequest.objects.filter(round=rnd).values_list("status", flat=True)) == {"pending"}

    # The person changed the first answer too: both are recorded as the retry says.
    assert record({"first": _answer("production"), "second": _answer("staging")}) == str(call.pk)
    recorded = dict(InputRequest.objects.filter(round=rnd).values_list("key", "content"))
    assert recorded == {"first": {"environment": "production"}, "second": {"environment": "staging"}}
