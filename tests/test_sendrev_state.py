"""The server's requestState across rounds, on the worker's send path (`sending.call_send`) against a scripted
2026-07-28 server over HTTP: only the latest round's state is echoed, so only the latest round keeps one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from approvals.models import InputRequest, McpServer, Membership, Round, ToolCall
from approvals.services import answers, sending
from tests import factories
from tests.test_sends_hostile import FORM, TOOLS, ScriptedServer, asking, done

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

BIG = 300_000  # characters of one requestState: a server may send far more, up to ELICIT_MAX_MCP_RESPONSE


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


def _call(scripted: ScriptedServer) -> ToolCall:
    release = factories.team("release")
    agent, _ = factories.agent("ci-bot")
    server = McpServer.objects.create(
        slug="scripted", name="scripted", url=scripted.url, default_team=release, tools=TOOLS
    )
    agent.servers.add(server)
    return factories.call(server, agent, tool="plain", arguments={})


def test_a_state_that_changes_every_round_is_echoed_as_the_latest_and_kept_only_by_the_open_round(
    scripted: ScriptedServer,
) -> None:
    states = [f"{n}" * BIG for n in range(1, 4)]
    scripted.script(asking({}, states[0]), asking({}, states[1]), asking({"name": FORM}, states[2]), done)
    call = _call(scripted)
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT, call.error
    # Each state-only round was retried at once, echoing exactly the state it had just received.
    assert [params.get("requestState", "ABSENT") for params in scripted.calls] == ["ABSENT", *states[:2]]
    rounds = list(Round.objects.filter(call=call).order_by("number").values_list("status", "request_state"))
    assert rounds == [
        (Round.Status.CLOSED, None),
        (Round.Status.CLOSED, None),
        (Round.Status.OPEN, states[2]),
    ]


def test_the_open_rounds_state_is_echoed_on_the_retry_and_forgotten_once_the_server_answers(
    scripted: ScriptedServer,
) -> None:
    scripted.script(asking({}, "first"), asking({"name": FORM}, "second"), done)
    call = _call(scripted)
    alice = factories.user("alice")
    Membership.objects.create(team=factories.team("release"), user=alice, role=Membership.Role.REVIEWER)
    sending.call_send(call_id=call.pk)
    ir = InputRequest.objects.get(round__call=call, status=InputRequest.Status.PENDING)
    answers.input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"name": "Ada"})
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert scripted.calls[-1]["requestState"] == "second"
    assert scripted.calls[-1]["inputResponses"] == {"name": {"action": "accept", "content": {"name": "Ada"}}}
    assert not Round.objects.filter(call=call, request_state__isnull=False).exists()


def test_a_server_that_only_ever_sends_state_is_stopped_after_the_round_limit_with_no_state_kept(
    scripted: ScriptedServer,
) -> None:
    scripted.script(lambda rid, params: asking({}, f"state-{len(scripted.calls)}")(rid, params))
    call = _call(scripted)
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.FAILED
    assert (call.error or {}).get("code") == "too_many_rounds"
    assert len(scripted.calls) == sending.MAX_ROUNDS + 1
    assert scripted.calls[-1]["requestState"] == f"state-{sending.MAX_ROUNDS}"
    assert Round.objects.filter(call=call).count() == sending.MAX_ROUNDS
    assert not Round.objects.filter(call=call, request_state__isnull=False).exists()


def test_a_round_of_too_many_keys_declines_each_and_its_record_forgets_them_once_answered(
    scripted: ScriptedServer,
) -> None:
    keys = [f"{n:04d}" + "k" * 400 for n in range(2000)]
    scripted.script(asking(dict.fromkeys(keys, FORM), "many"), done)
    call = _call(scripted)
    sending.call_send(call_id=call.pk)
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert scripted.calls[-1]["inputResponses"] == {key: {"action": "decline"} for key in keys}
    raw = Round.objects.get(call=call).raw
    assert raw["truncated"] is True and raw["size"] > 800_000
    assert "declined_keys" not in raw


def test_closing_a_round_keeps_the_record_of_one_that_declined_nothing(scripted: ScriptedServer) -> None:
    scripted.script(asking({}, "only-state"), done)
    call = _call(scripted)
    sending.call_send(call_id=call.pk)
    assert Round.objects.get(call=call).raw == {"resultType": "input_required", "inputRequests": {}}
