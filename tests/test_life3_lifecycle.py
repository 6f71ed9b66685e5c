"""A send that may have reached its server and was put back for a retry (a tool safe to repeat) leaves the
call's outcome unknown until a later send settles it: an agent's cancel meanwhile, or giving up after the
retries, says the tool may have run, whatever the last attempt's fault was.

The server is the scripted MCP server of the call-fate tests (a real HTTP server on a loopback port); the
hub sends through `sending.call_send`, as a worker does.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from approvals.models import AgentClient, AuditEvent, Gate, McpServer, Round, ToolCall
from approvals.services import calls, sending, tokens
from tests import factories
from tests.test_call_fate import TOOLS, Script, ScriptedServer, scripted  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]


@pytest.fixture
def server(scripted: ScriptedServer) -> ScriptedServer:  # noqa: F811
    scripted.script = Script()
    return scripted


def _set_up(url: str, **extra: Any) -> tuple[AgentClient, ToolCall]:
    srv = McpServer.objects.create(slug="scripted", name="Scripted", url=url, tools=TOOLS, **extra)
    agent, _ = tokens.agent_create(name="ci-agent", servers=[srv])
    return agent, factories.call(srv, agent, tool="again", arguments={})


def test_a_cancel_while_a_send_that_may_have_run_waits_for_its_retry_says_the_tool_may_have_run(
    server: ScriptedServer,
) -> None:
    server.script = Script(steps=[("status", 504)])  # a gateway's 504: the server may have run it
    agent, call = _set_up(server.url)
    countdown = sending.call_send(call_id=call.pk)
    assert countdown is not None and countdown > 0  # the tool is safe to repeat: a retry is scheduled
    assert len(server.script.calls) == 1

    cancelled = calls.call_cancel(agent=agent, call_id=call.pk)

    assert cancelled.status == ToolCall.Status.CANCELLED
    assert cancelled.error is not None and cancelled.error["tool_may_have_run"] is True


def test_a_cancel_while_a_refused_send_waits_for_its_retry_says_nothing_ran(server: ScriptedServer) -> None:
    server.script = Script(steps=[("status", 429)])  # refused before it ran
    agent, call = _set_up(server.url)
    assert sending.call_send(call_id=call.pk)

    cancelled = calls.call_cancel(agent=agent, call_id=call.pk)

    assert cancelled.status == ToolCall.Status.CANCELLED
    assert cancelled.error is None


@override_settings(ELICIT_MCP_MAX_RETRIES=1)
def test_giving_up_after_a_send_that_may_have_run_says_the_tool_may_have_run(server: ScriptedServer) -> None:
    # First a 504 (it may have run), then a refusal (429) on the retry: the retries run out.
    server.script = Script(steps=[("status", 504), ("status", 429)])
    _, call = _set_up(server.url)
    assert sending.call_send(call_id=call.pk)
    assert sending.call_send(call_id=call.pk) is None

    call.refresh_from_db()
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "rate_limited", call.error
    assert call.error["tool_may_have_run"] is True
    assert len(server.script.calls) == 2


def test_a_transient_fault_of_a_call_cancelled_meanwhile_schedules_no_retry(server: ScriptedServer) -> None:
    server.script = Script(steps=[("status", 504)])
    agent, call = _set_up(server.url)
    original = sending.mcp_client.run

    def cancelled_in_flight(coro: Any) -> Any:
        try:
            return original(coro)
        finally:
            calls.call_cancel(agent=agent, call_id=call.pk)  # the agent gives up while the send is out

    sending.mcp_client.run = cancelled_in_flight  # type: ignore[assignment]
    try:
        countdown = sending.call_send(call_id=call.pk)
    finally:
        sending.mcp_client.run = original  # type: ignore[assignment]

    assert countdown is None
    call.refresh_from_db()
    assert call.status == ToolCall.Status.CANCELLED and call.error["tool_may_have_run"] is True
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="call.retry_scheduled").exists()
    assert AuditEvent.objects.filter(call_id=call.pk, verb="call.outcome_discarded").exists()


def test_a_server_asking_past_the_round_limit_ends_the_call_saying_the_tool_may_have_run(
    server: ScriptedServer,
) -> None:
    server.script = Script(steps=[("state_only",)])  # input_required with a state, for ever
    _, call = _set_up(server.url)
    assert sending.call_send(call_id=call.pk) is None

    call.refresh_from_db()
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "too_many_rounds"
    # As on a session: each retry reached the server, which may have acted before asking again.
    assert call.error["tool_may_have_run"] is True
    assert len(server.script.calls) == sending.MAX_ROUNDS + 1


def test_nothing_is_sent_to_a_server_disabled_after_the_call_was_queued(server: ScriptedServer) -> None:
    _, call = _set_up(server.url)
    McpServer.objects.filter(pk=call.server_id).update(enabled=False)

    assert sending.call_send(call_id=call.pk) is None

    assert server.script.calls == []
    call.refresh_from_db()
    assert (call.status, call.attempts) == (ToolCall.Status.QUEUED, 0)
    # Enabled again: the call is sent as it would have been.
    McpServer.objects.filter(pk=call.server_id).update(enabled=True)
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED
    assert len(server.script.calls) == 1


def test_an_answered_round_is_not_sent_to_a_server_disabled_while_it_waited(server: ScriptedServer) -> None:
    server.script = Script(steps=[("state_only",), ("result",)])
    _, call = _set_up(server.url)
    original = sending._apply

    def disabled_meanwhile(send: Any, outcome: Any, **kwargs: Any) -> bool:
        McpServer.objects.filter(pk=call.server_id).update(enabled=False)
        return original(send, outcome, **kwargs)

    sending._apply = disabled_meanwhile  # type: ignore[assignment]
    try:
        sending.call_send(call_id=call.pk)
    finally:
        sending._apply = original  # type: ignore[assignment]

    assert len(server.script.calls) == 1
    call.refresh_from_db()
    assert call.status == ToolCall.Status.RESUMING
    assert call.rounds.get().status == "ready"


def test_an_approved_call_to_a_disabled_server_lists_no_tools_there(server: ScriptedServer) -> None:
    _, call = _set_up(server.url)
    McpServer.objects.filter(pk=call.server_id).update(enabled=False, tools_fetched_at=None)
    rnd = Round.objects.create(call=call, number=1, kind=Round.Kind.GATE, deadline=timezone.now())
    Gate.objects.create(
        round=rnd, call=call, status=Gate.Status.APPROVED, rule_revision=1, digest="d", approved_digest="d"
    )

    assert sending.call_send(call_id=call.pk) is None

    # A stale list is refreshed before an approved call's first send; not from a disabled server.
    assert McpServer.objects.get(pk=call.server_id).tools_fetched_at is None
    assert server.script.calls == []
