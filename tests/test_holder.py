"""Push elicitation end to end: a handshake-era server asks in the middle of tools/call, a reviewer answers
through the API, the answer goes back on the same session.

Real parts only: the server is an ``mcp`` 2.3 `MCPServer` whose tools use ``ctx.elicit()``
(tests/push_server.py, served over Streamable HTTP with sessions); the holder is ``manage.py run_holder`` in
its own process, on the test database; the agent and the reviewer use the HTTP API.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import AgentClient, AuditEvent, Holder, InputRequest, McpServer, Round, ToolCall
from approvals.services import holding, sending
from tests.hub import Hub, set_up_hub
from tests.live import HolderRunner, child_env, wait_until
from tests.test_session import PushServer

WAIT = 4  # seconds the push server waits for an answer (and the hub's elicitation_wait for it)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def push() -> Iterator[PushServer]:
    server = PushServer(wait=WAIT)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub(live_db: None, push: PushServer) -> Hub:
    hub = set_up_hub(push.url, slug="pushy", honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(era=McpServer.Era.HANDSHAKE, elicitation_wait=WAIT)
    hub.server.refresh_from_db()
    return hub


@pytest.fixture
def holder(live_db: None) -> Iterator[HolderRunner]:
    runner = HolderRunner(child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1")).start()
    try:
        yield runner
    finally:
        runner.stop()


def _text(call: dict[str, Any]) -> str:
    assert call["status"] == "completed", call
    return str(call["result"]["content"][0]["text"])


def _finished(hub: Hub, call_id: str, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        call = hub.agent.get(f"/calls/{call_id}").json()
        return call if call["status"] in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(done, timeout, 0.1, what=f"call {call_id} to end")  # type: ignore[return-value]


def test_a_typed_answer_reaches_the_server_on_the_same_session(
    hub: Hub, holder: HolderRunner, push: PushServer
) -> None:
    before = push.counts().get("ask", 0)
    call_id = hub.agent.call("ask", {"question": "Which branch?"}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    assert item["mode"] == "form"
    assert item["message"] == "Which branch?"
    assert item["team"] == "release"
    rnd = Round.objects.get(call_id=call_id)
    assert rnd.kind == Round.Kind.PUSH
    assert rnd.server_deadline is not None
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.AWAITING_INPUT

    response = hub.reviewer.respond(item["id"], "accept", {"text": "release-7"})
    assert response.status_code == 200, response.content

    call = _finished(hub, call_id)
    assert _text(call) == "accepted: release-7"
    assert push.counts()["ask"] == before + 1
    rnd.refresh_from_db()
    assert (rnd.status, rnd.outcome) == (Round.Status.CLOSED, Round.Outcome.ANSWERED)
    verbs = list(AuditEvent.objects.filter(call_id=call_id).values_list("verb", flat=True))
    assert verbs[:3] == ["call.submitted", "call.held", "round.opened"]
    assert "input.answered" in verbs and verbs[-1] == "call.completed"


@pytest.mark.parametrize(("action", "said"), [("decline", "declined"), ("cancel", "cancelled")])
def test_decline_and_cancel_reach_the_server(hub: Hub, holder: HolderRunner, action: str, said: str) -> None:
    call_id = hub.agent.call("ask", {"question": "Ship it?"}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    assert hub.reviewer.respond(item["id"], action).status_code == 200
    assert _text(_finished(hub, call_id)) == said


def test_the_server_stopping_to_wait_makes_the_request_gone(hub: Hub, holder: HolderRunner) -> None:
    call_id = hub.agent.call("ask", {"question": "Anyone?"}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    assert item["server_deadline"] is not None
    page = Client()
    page.force_login(hub.reviewer_user)
    shown = page.get(reverse("approvals:request", args=[item["id"]])).content.decode()
    assert "data-server-deadline" in shown
    assert "The server waits until" in shown

    call = _finished(hub, call_id, timeout=WAIT + 20)
    assert _text(call) == "stopped waiting"
    ir = InputRequest.objects.get(pk=item["id"])
    assert ir.status == InputRequest.Status.GONE
    assert (ir.round.status, ir.round.outcome) == (Round.Status.CLOSED, Round.Outcome.GONE)
    assert item["id"] not in [i["id"] for i in hub.reviewer.inbox()]

    late = hub.reviewer.respond(item["id"], "accept", {"text": "too late"})
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "request_gone"
    assert "gone" in late.json()["error"]["message"]
    assert AuditEvent.objects.filter(call_id=call_id, verb="round.gone").exists()

    shown = page.get(reverse("approvals:request", args=[item["id"]])).content.decode()
    assert "This request is gone" in shown
    assert "data-server-deadline" not in shown
    answered = page.post(reverse("approvals:respond", args=[item["id"]]), {"action": "decline"})
    assert answered.status_code == 409
    assert "This request is gone" in answered.content.decode()
    rounds = hub.agent.get(f"/calls/{call_id}").json()["rounds"]
    assert (rounds[0]["kind"], rounds[0]["outcome"]) == ("push", "gone")
    assert rounds[0]["input_requests"][0]["status"] == "gone"


def test_url_mode_elicitation(hub: Hub, holder: HolderRunner) -> None:
    call_id = hub.agent.call("ask_url", {}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    assert item["mode"] == "url"
    assert item["url"] == "https://example.com/sign-in"
    assert hub.reviewer.respond(item["id"], "accept").status_code == 200
    assert _text(_finished(hub, call_id)) == "url accept"


def test_url_required_is_not_resent_unless_safe(hub: Hub, holder: HolderRunner, push: PushServer) -> None:
    before = push.counts().get("needs_auth", 0)
    call_id = hub.agent.call("needs_auth", {}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "auth-1")
    assert item["mode"] == "url"
    assert item["url"] == "https://example.com/authorize"
    assert hub.reviewer.respond(item["id"], "accept").status_code == 200
    call = _finished(hub, call_id)
    assert call["status"] == "failed"
    assert call["error"]["code"] == "url_elicitation_required"
    assert "auth-1: accept" in call["error"]["message"]
    assert push.counts()["needs_auth"] == before + 1


def test_url_required_is_resent_when_the_server_honours_idempotency_keys(
    hub: Hub, holder: HolderRunner, push: PushServer
) -> None:
    McpServer.objects.filter(pk=hub.server.pk).update(honours_idempotency_key=True)
    call_id = hub.agent.call("needs_auth", {}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "auth-1")
    push.authorize()
    assert hub.reviewer.respond(item["id"], "accept").status_code == 200
    assert _text(_finished(hub, call_id)) == "authorized work done"


def test_celery_never_sends_a_call_that_needs_a_session(hub: Hub, push: PushServer) -> None:
    before = push.counts().get("echo", 0)
    call_id = hub.agent.call("echo", {"text": "hi"}, server="pushy")
    assert sending.call_send(call_id=call_id) is None
    call = ToolCall.objects.get(pk=call_id)
    assert (call.status, call.holder_id, call.started_at) == (ToolCall.Status.QUEUED, None, None)
    assert push.counts().get("echo", 0) == before


def test_progress_is_stored(hub: Hub, holder: HolderRunner) -> None:
    call_id = hub.agent.call("count_steps", {"steps": 3}, server="pushy")
    assert _text(_finished(hub, call_id)) == "3 steps"
    progress = ToolCall.objects.get(pk=call_id).progress
    assert progress is not None
    assert (progress["progress"], progress["total"], progress["message"]) == (3, 3, "step 3")


ECHO = {
    "name": "echo",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "outputSchema": {"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"]},
}


@pytest.mark.parametrize("stored", [True, False])
def test_a_held_call_lists_no_tools_after_its_tool_ran(
    hub: Hub, holder: HolderRunner, push: PushServer, stored: bool
) -> None:
    # The SDK checks a result against the tool's output schema, and on a session that has not listed the
    # tools it listed them first: after every call, once the tool had run. The holder now gives the session
    # the stored definition, or lists before the call when there is none.
    if stored:
        McpServer.objects.filter(pk=hub.server.pk).update(tools=[ECHO])
    before = push.counts()
    call_id = hub.agent.call("echo", {"text": "hi"}, server="pushy")
    assert _text(_finished(hub, call_id)) == "echo: hi"
    after = push.counts()
    lists = after.get("method:tools/list", 0) - before.get("method:tools/list", 0)
    assert lists == (0 if stored else 1)
    assert after.get("method:tools/call", 0) - before.get("method:tools/call", 0) == 1


def test_a_changed_tool_list_is_listed_again_on_the_session(hub: Hub, holder: HolderRunner) -> None:
    call_id = hub.agent.call("grow", {}, server="pushy")
    assert _text(_finished(hub, call_id)) == "grown"

    def stored() -> dict[str, Any] | None:
        return McpServer.objects.get(pk=hub.server.pk).tool("wipe")

    wipe = wait_until(stored, 10, 0.1, what="the changed tool list stored")
    assert wipe["annotations"]["destructiveHint"] is True  # type: ignore[index]


def test_killing_the_holder_mid_wait_ends_the_call_holder_lost(
    hub: Hub, holder: HolderRunner, push: PushServer
) -> None:
    McpServer.objects.filter(pk=hub.server.pk).update(elicitation_wait=600)
    before = push.counts().get("ask", 0)
    call_id = hub.agent.call("ask", {"question": "Still there?"}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    holder.kill()
    held = ToolCall.objects.get(pk=call_id)
    assert held.holder is not None and held.status == ToolCall.Status.AWAITING_INPUT

    # Not stale yet: nothing happens.
    assert holding.holders_sweep() == 0
    ended = holding.holders_sweep(now=timezone.now() + timedelta(seconds=120))
    assert ended == 1

    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "holder_lost"
    assert call.error["tool_may_have_run"] is True
    assert call.holder is None
    assert InputRequest.objects.get(pk=item["id"]).status == InputRequest.Status.GONE
    assert not Holder.objects.filter(name__startswith="holder-").exists()
    assert AuditEvent.objects.filter(verb="holder.lost").exists()
    gone = hub.reviewer.respond(item["id"], "accept", {"text": "x"})
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "request_gone"
    assert push.counts()["ask"] == before + 1
    assert sending.call_send(call_id=call_id) is None
    assert push.counts()["ask"] == before + 1


def test_a_lost_holders_unsent_calls_go_back_to_the_queue(hub: Hub) -> None:
    lost = Holder.objects.create(name="gone-holder", heartbeat_at=timezone.now() - timedelta(minutes=5))
    call_id = hub.agent.call("echo", {"text": "later"}, server="pushy")
    assert holding.holder_claim(holder_id=lost.pk, limit=10) == [call_id]
    assert holding.holders_sweep() == 0  # nothing had been sent, so nothing failed
    call = ToolCall.objects.get(pk=call_id)
    assert (call.status, call.holder_id) == (ToolCall.Status.QUEUED, None)
    assert not Holder.objects.filter(pk=lost.pk).exists()


def test_claims_take_each_call_once(hub: Hub) -> None:
    first = Holder.objects.create(name="h1")
    second = Holder.objects.create(name="h2")
    ids = {hub.agent.call("echo", {"text": str(n)}, server="pushy") for n in range(3)}
    modern = McpServer.objects.create(
        slug="modern", name="Modern", url="http://127.0.0.1:9/mcp", era=McpServer.Era.MODERN
    )
    other = ToolCall.objects.create(server=modern, tool="echo")
    got = holding.holder_claim(holder_id=first.pk, limit=2)
    assert len(got) == 2
    got += holding.holder_claim(holder_id=second.pk, limit=10)
    assert sorted(got) == sorted(ids)
    assert ToolCall.objects.get(pk=other.pk).holder_id is None


def test_a_stdio_servers_elicitation_reaches_a_reviewer(hub: Hub, holder: HolderRunner) -> None:
    from tests.test_stdio import SERVER_SCRIPT

    local = McpServer.objects.create(
        slug="local-tools",
        name="Local tools",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(SERVER_SCRIPT)],
        era=McpServer.Era.HANDSHAKE,
        default_team=hub.server.default_team,
    )
    AgentClient.objects.get(name="ci-agent").servers.add(local)
    call_id = hub.agent.call("ask", {}, server="local-tools")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    assert item["message"] == "What is your name?"
    assert hub.reviewer.respond(item["id"], "accept", {"name": "Grace"}).status_code == 200
    assert _text(_finished(hub, call_id)) == "hello Grace"
    assert McpServer.objects.get(pk=local.pk).stdio_holder is not None


def test_a_holder_stopped_mid_wait_ends_its_calls_at_once(hub: Hub, holder: HolderRunner) -> None:
    McpServer.objects.filter(pk=hub.server.pk).update(elicitation_wait=600)
    call_id = hub.agent.call("ask", {"question": "Before the restart?"}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "elicitation")
    holder.stop()  # SIGTERM: a deploy or a restart
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "holder_lost"
    assert call.error["tool_may_have_run"] is True
    assert InputRequest.objects.get(pk=item["id"]).status == InputRequest.Status.GONE
    assert not Holder.objects.exists()


def test_an_agent_cancelling_a_held_call_answers_the_server_cancel(hub: Hub, holder: HolderRunner) -> None:
    call_id = hub.agent.call("ask", {"question": "Go?"}, server="pushy")
    hub.reviewer.wait_for_request(call_id, "elicitation")
    assert hub.agent.post(f"/calls/{call_id}/cancel", {}).status_code == 200

    def discarded() -> bool:
        return AuditEvent.objects.filter(call_id=call_id, verb="call.outcome_discarded").exists()

    wait_until(discarded, 30, 0.1, what="the server's answer after the cancel")
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.CANCELLED
    assert call.result is None


def test_an_agent_cancelling_a_held_call_while_its_tool_runs_stops_the_tool_on_the_server(
    hub: Hub, holder: HolderRunner, push: PushServer
) -> None:
    before = push.counts()
    call_id = hub.agent.call("slow", {"seconds": 120}, server="pushy")
    wait_until(
        lambda: push.counts().get("slow", 0) > before.get("slow", 0), 30, 0.1, what="the tool to start"
    )
    assert hub.agent.post(f"/calls/{call_id}/cancel", {}).status_code == 200

    # The holder stops waiting for the result and the SDK tells the server: the tool stops now, not in 2 min.
    wait_until(
        lambda: push.counts().get("slow.cancelled", 0) > before.get("slow.cancelled", 0),
        20,
        0.1,
        what="the server to stop the tool",
    )
    stops = AuditEvent.objects.filter(call_id=call_id, verb="call.stop_sent")
    wait_until(stops.exists, 10, 0.1, what="the stop in the audit log")
    stop = stops.get().data
    assert (stop["status"], stop["sent"]) == ("cancelled", "notifications/cancelled")
    assert stop["holder"]
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.CANCELLED
    assert call.result is None
    # The holder's task is over: the call is no longer held, and the holder takes new calls.
    echo = hub.agent.call("echo", {"text": "still here"}, server="pushy")
    assert _text(_finished(hub, echo)) == "echo: still here"


def test_a_gated_call_runs_on_the_holder_with_the_arguments_a_reviewer_edited(
    hub: Hub, holder: HolderRunner, push: PushServer
) -> None:
    from approvals.models import Gate, RoutingRule, Team

    RoutingRule.objects.create(
        name="echo waits for approval",
        server=hub.server,
        tool_pattern="echo",
        gate=True,
        team=Team.objects.get(slug="release"),
    )
    from approvals.services import servers

    servers.server_refresh_tools(server=hub.server)  # the tool list the approval covers (probed on a session)
    before = push.counts().get("echo", 0)
    call_id = hub.agent.call("echo", {"text": "asked"}, server="pushy")
    item = hub.reviewer.wait_for_request(call_id, "gate")
    assert item["gate"]["tool"]["description"] == "Return the text."
    assert ToolCall.objects.get(pk=call_id).holder_id is None  # no holder takes a call waiting at a gate
    decided = hub.reviewer.post(
        f"/input-requests/{item['id']}/decide", {"decision": "edit", "arguments": {"text": "edited"}}
    )
    assert decided.status_code == 200, decided.content
    assert _text(_finished(hub, call_id)) == "echo: edited"
    assert push.counts()["echo"] == before + 1
    assert Gate.objects.get(call_id=call_id).status == Gate.Status.USED
    verbs = list(AuditEvent.objects.filter(call_id=call_id).values_list("verb", flat=True))
    assert verbs.index("gate.approved") < verbs.index("call.held") < verbs.index("gate.used")
