"""Deadlines: an answer that comes after a round's deadline is too late even before beat's sweep expires the
round, and the server gets what the policy says expiry does."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from approvals import tasks
from approvals.models import AuditEvent, McpServer, Membership, Policy, Round, RoutingRule, Team, ToolCall
from approvals.services import tokens
from approvals.services.rounds import HOLDER_CHANNEL
from tests import demo_support, factories
from tests.hub import Hub, Reviewer, set_up_hub
from tests.live import HolderRunner, child_env, wait_until
from tests.test_session import PushServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def hub(worker, demo_server) -> Hub:
    demo_support.reset(demo_server.url)
    return set_up_hub(demo_server.url)


def _retries(demo_url: str) -> list[dict]:
    return [
        r["body"]["params"]["inputResponses"]
        for r in demo_support.recorded_requests(demo_url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]


def _short_clock(on_expiry: str, approvals_required: int = 1) -> Policy:
    policy = Policy.objects.create(
        name=f"short {on_expiry}", ttl=120, on_expiry=on_expiry, approvals_required=approvals_required
    )
    RoutingRule.objects.create(
        position=1, name="short clock", tool_pattern="*", team=Team.objects.get(slug="release"), policy=policy
    )
    return policy


@pytest.mark.parametrize("on_expiry", ["cancel", "abandon"])
def test_an_answer_after_the_deadline_is_refused_before_the_sweep(
    hub: Hub, demo_server, on_expiry: str
) -> None:
    _short_clock(on_expiry)
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    # The deadline passed; beat has not swept yet (a busy worker, a stopped beat).
    Round.objects.filter(call_id=call_id).update(deadline=timezone.now() - timedelta(seconds=5))

    late = hub.reviewer.respond(item["id"], "accept", {"environment": "production"})
    assert late.status_code == 409, late.content
    error = late.json()["error"]
    assert error["code"] == "already_answered" and "expired at" in error["message"]

    assert tasks.expire_stale() == 1
    body = hub.agent.wait(call_id)
    assert body["status"] == "expired"
    if on_expiry == "abandon":
        assert _retries(demo_server.url) == []
    else:
        assert _retries(demo_server.url) == [{"environment": {"action": "cancel"}}]


def test_a_late_approval_does_not_count_toward_n_of_m(hub: Hub) -> None:
    _short_clock("abandon", approvals_required=2)
    bob = factories.user("bob")
    Membership.objects.create(team=Team.objects.get(slug="release"), user=bob)
    bob_reviewer = Reviewer(tokens.personal_token_create(user=bob)[1])
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    assert (
        hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).json()["status"] == "pending"
    )
    Round.objects.filter(call_id=call_id).update(deadline=timezone.now() - timedelta(seconds=5))
    late = bob_reviewer.respond(item["id"], "accept", {"environment": "staging"})
    assert late.status_code == 409 and late.json()["error"]["code"] == "already_answered"
    assert tasks.expire_stale() == 1
    assert hub.agent.wait(call_id)["status"] == "expired"


@pytest.mark.parametrize("on_expiry", ["cancel", "abandon"])
def test_expiring_a_question_a_holder_waits_on_wakes_the_holder(live_db: None, on_expiry: str) -> None:
    """A push round (a handshake-era server waits on the session) that expires is the holder's to answer on
    that session: it is woken (``call:<id>``), abandoned or not, and does not leave the server waiting until
    its next look at the round."""
    server = factories.server(era="handshake", on_expiry=on_expiry)
    call = factories.call(server, status=ToolCall.Status.AWAITING_INPUT)
    rnd = factories.open_round(call, team_=factories.team("release"), request_state=None)
    Round.objects.filter(pk=rnd.pk).update(
        kind=Round.Kind.PUSH, deadline=timezone.now() - timedelta(seconds=1)
    )
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f"LISTEN {HOLDER_CHANNEL}")
        assert tasks.expire_stale() == 1
        heard = [notice.payload for notice in listener.notifies(timeout=10, stop_after=1)]
    assert heard == [f"call:{call.pk}"]
    rnd.refresh_from_db()
    assert rnd.outcome == (Round.Outcome.ABANDONED if on_expiry == "abandon" else Round.Outcome.EXPIRED)
    assert ToolCall.objects.get(pk=call.pk).status == (
        ToolCall.Status.EXPIRED if on_expiry == "abandon" else ToolCall.Status.AWAITING_INPUT
    )


def test_an_abandoned_question_on_a_held_session_ends_the_tool_on_the_server(live_db: None) -> None:
    """End to end with a holder: the server waits ten minutes for its answer; the hub's clock (the policy's)
    runs out first and its policy abandons the call. The server is answered ``cancel`` on its session (its
    tool returns, and the hub discards that result: the call had already ended ``expired``)."""
    push = PushServer(wait=600)
    holder = HolderRunner(child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1")).start()
    try:
        hub = set_up_hub(push.url, slug="pushy", honours_idempotency_key=False)
        McpServer.objects.filter(pk=hub.server.pk).update(era=McpServer.Era.HANDSHAKE, elicitation_wait=600)
        _short_clock("abandon")
        call_id = hub.agent.call("ask", {"question": "Ship it?"}, server="pushy")
        hub.reviewer.wait_for_request(call_id, "elicitation")
        Round.objects.filter(call_id=call_id).update(deadline=timezone.now() - timedelta(seconds=1))
        # Beat's sweep skips a round the holder is reading at that moment (it looks every second): again.
        wait_until(lambda: tasks.expire_stale() == 1, 30, 0.1, what="the sweep to expire the round")
        call = ToolCall.objects.get(pk=call_id)
        assert (call.status, call.error["code"]) == (ToolCall.Status.EXPIRED, "expired")
        discarded = AuditEvent.objects.filter(call_id=call_id, verb="call.outcome_discarded")
        wait_until(discarded.exists, 60, 0.1, what="the server's answer to the cancel")
        assert ToolCall.objects.get(pk=call_id).result is None
    finally:
        holder.stop()
        push.stop()


def test_an_agent_cannot_give_a_relay_longer_than_the_policy_allows(db) -> None:
    """The policy's clock is a limit the agent cannot lengthen: a relay's ``expires_in`` only shortens it."""
    hub = set_up_hub("http://127.0.0.1:9/mcp")
    _short_clock("cancel")  # 120 s

    def relay(expires_in: int) -> Round:
        body = {
            "server": "demo",
            "tool": "create_deployment",
            "arguments": {"branch": "main"},
            "input_requests": {
                "environment": {
                    "method": "elicitation/create",
                    "params": {"message": "Which one?", "requestedSchema": factories.ENVIRONMENT_SCHEMA},
                }
            },
            "expires_in": expires_in,
        }
        response = hub.agent.post("/relays", body)
        assert response.status_code == 201, response.content
        return Round.objects.get(call_id=response.json()["id"])

    week = relay(7 * 24 * 3600)
    assert (week.deadline - week.opened_at).total_seconds() == pytest.approx(120, abs=1)
    shorter = relay(30)
    assert (shorter.deadline - shorter.opened_at).total_seconds() == pytest.approx(30, abs=1)
