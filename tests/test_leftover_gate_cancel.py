"""A gated call its agent cancels: the gate ends ``cancelled`` (not "open", not "approved") in the agent's
read of the call and on the pages, and a decision that comes afterwards is refused, clearly, with nothing
sent (on the real PostgreSQL; the REST API through Django's test client)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import Client
from django.utils import timezone

from approvals import selectors
from approvals.models import Gate, InputRequest, McpServer, Membership, Policy, Round, RoutingRule, ToolCall
from approvals.services import answers, calls, gate_decisions, gates, sending, tokens
from approvals.services.errors import Conflict
from tests import factories
from tests.live import wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def gated() -> dict[str, Any]:
    """A server with a destructive tool, a gate rule on it for team "release" (alice), an agent."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[
            {
                "name": "wipe",
                "inputSchema": {"type": "object", "properties": {"bucket": {"type": "string"}}},
                "annotations": {"destructiveHint": True},
            }
        ],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(
        name="wipes",
        server=server,
        tool_pattern="wipe",
        gate=True,
        team=release,
        policy=Policy.objects.create(name="one approval"),
    )
    agent, agent_token = tokens.agent_create(name="bot", servers=[server])
    call, created = calls.call_submit(
        agent=agent, server_slug="deploy", tool="wipe", arguments={"bucket": "x"}
    )
    assert created and call.status == ToolCall.Status.AWAITING_INPUT
    return {
        "alice": alice,
        "agent": agent,
        "agent_token": agent_token,
        "call": call,
        "request": InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE),
    }


def gate_of(call: ToolCall) -> dict[str, Any]:
    """The gate as the agent reads it (GET /api/v1/calls/<id>, the MCP result's _meta)."""
    gate = selectors.call_detail(selectors.calls_with_rounds().get(pk=call.pk))["gate"]
    assert gate is not None
    return gate


def test_a_cancelled_gate_is_cancelled_and_a_later_approval_is_refused(gated: dict[str, Any]) -> None:
    call = gated["call"]
    calls.call_cancel(agent=gated["agent"], call_id=call.pk)

    gate = Gate.objects.get(call=call)
    assert gate.status == Gate.Status.CANCELLED and gate.decided_at is not None
    assert gate_of(call)["status"] == "cancelled"

    with pytest.raises(Conflict) as refused:
        gate_decisions.gate_decide(
            input_request_id=gated["request"].pk, user=gated["alice"], decision="approve"
        )
    assert refused.value.code == "already_answered"
    assert refused.value.message.startswith("The agent cancelled this call at ")
    assert "it was not sent" in refused.value.message
    call.refresh_from_db()
    assert call.status == ToolCall.Status.CANCELLED
    assert Gate.objects.get(call=call).status == Gate.Status.CANCELLED
    assert sending._claim(call.pk) is None  # what a worker would do: nothing to send


def test_an_approved_gate_not_sent_yet_is_cancelled_and_keeps_who_approved(gated: dict[str, Any]) -> None:
    call = gated["call"]
    gate_decisions.gate_decide(input_request_id=gated["request"].pk, user=gated["alice"], decision="approve")
    approved = Gate.objects.get(call=call)
    assert approved.status == Gate.Status.APPROVED

    calls.call_cancel(agent=gated["agent"], call_id=call.pk)

    gate = Gate.objects.get(call=call)
    assert gate.status == Gate.Status.CANCELLED
    assert (gate.decided_by, gate.decided_at) == (gated["alice"], approved.decided_at)
    assert gate_of(call)["status"] == "cancelled"
    assert sending._claim(call.pk) is None
    assert Gate.objects.get(call=call).status == Gate.Status.CANCELLED  # not used by a send


def test_over_the_api_and_on_the_pages(gated: dict[str, Any]) -> None:
    call, ir = gated["call"], gated["request"]
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {gated['agent_token']}")
    assert agent.post(f"/api/v1/calls/{call.pk}/cancel").status_code == 200
    assert agent.get(f"/api/v1/calls/{call.pk}").json()["gate"]["status"] == "cancelled"

    reviewer = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.personal_token_create(user=gated['alice'])[1]}")
    decided = reviewer.post(
        f"/api/v1/input-requests/{ir.pk}/decide", {"decision": "approve"}, content_type="application/json"
    )
    assert decided.status_code == 409
    assert decided.json()["error"]["code"] == "already_answered"
    assert decided.json()["error"]["message"].startswith("The agent cancelled this call at ")

    browser = Client()
    browser.force_login(gated["alice"])
    page = browser.get(f"/requests/{ir.pk}/").content.decode()
    assert 'data-gate-status="cancelled">Cancelled by the agent: not sent<' in page
    call_page = browser.get(f"/calls/{call.pk}/").content.decode()
    assert 'data-gate-summary="cancelled"' in call_page


def in_thread(work: Callable[[], Any], errors: dict[str, str], name: str) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except Exception as exc:  # the test asserts there were none
            errors[name] = repr(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def a_backend_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return bool(cursor.fetchone()[0])


def race(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    name: str,
    first: Callable[[], Any],
    cancel: Callable[[], Any],
) -> dict[str, str]:
    """`first` runs until it calls `module.name` (its locks taken), and waits there until the agent's cancel
    waits for a lock it holds; then both go on. The errors of either."""
    paused, go = threading.Event(), threading.Event()
    original = getattr(module, name)

    def pause(*args: Any, **kwargs: Any) -> Any:
        paused.set()
        assert go.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, pause)
    errors: dict[str, str] = {}
    threads = [in_thread(first, errors, "first")]
    try:
        assert paused.wait(30)
        threads.append(in_thread(cancel, errors, "cancel"))
        wait_until(a_backend_waits_for_a_lock, what="the cancel to wait for a lock")
    finally:
        go.set()
        for thread in threads:
            thread.join(30)
    return errors


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls an approval queues for a worker, kept here: the suite's Celery worker (started by an earlier
    test, for the session) would otherwise claim the send itself, and the race below is the test's own."""
    sent: list[str] = []
    monkeypatch.setattr(
        gate_decisions,
        "enqueue_on_commit",
        lambda task, call_id: transaction.on_commit(lambda: sent.append(call_id)),
    )
    return sent


@pytest.mark.django_db(transaction=True)
def test_a_decision_racing_the_cancel_neither_deadlocks_nor_sends(
    gated: dict[str, Any], monkeypatch: pytest.MonkeyPatch, queued: list[str]
) -> None:
    """The reviewer approves as the agent cancels: the approval holds the gate's round as the cancel comes."""
    call, ir = gated["call"], gated["request"]
    errors = race(
        monkeypatch,
        answers,
        "round_mark_ready",
        lambda: gate_decisions.gate_decide(input_request_id=ir.pk, user=gated["alice"], decision="approve"),
        lambda: calls.call_cancel(agent=gated["agent"], call_id=call.pk),
    )
    assert errors == {}
    assert ToolCall.objects.get(pk=call.pk).status == ToolCall.Status.CANCELLED
    gate = Gate.objects.get(call=call)
    assert (gate.status, gate.decided_by) == (Gate.Status.CANCELLED, gated["alice"])
    assert sending._claim(call.pk) is None


@pytest.mark.django_db(transaction=True)
def test_a_send_claimed_as_the_agent_cancels_neither_deadlocks_nor_loses_its_gate(
    gated: dict[str, Any], monkeypatch: pytest.MonkeyPatch, queued: list[str]
) -> None:
    """The worker claims the approved call's send as the agent cancels: the claim holds the gate."""
    call, ir = gated["call"], gated["request"]
    gate_decisions.gate_decide(input_request_id=ir.pk, user=gated["alice"], decision="approve")
    assert queued == [str(call.pk)]  # the approval queued the send; this test's thread claims it
    claimed: list[Any] = []
    errors = race(
        monkeypatch,
        gates,
        "_current_digest",
        lambda: claimed.append(sending._claim(call.pk)),
        lambda: calls.call_cancel(agent=gated["agent"], call_id=call.pk),
    )
    assert errors == {}
    assert claimed[0] is not None  # the claim came first: the call went on its way
    assert Gate.objects.get(call=call).status == Gate.Status.USED
    cancelled = ToolCall.objects.get(pk=call.pk)
    assert cancelled.status == ToolCall.Status.CANCELLED
    assert cancelled.error["code"] == "cancelled_while_sending"
