"""One task, one send's time: a task's time limits leave room for one send of the longest allowed call, so a
state-only round after a long send is left to a new task rather than sent where the limit may cut it (which
ends a tool not safe to repeat ``outcome_unknown``). The send path (`sending.call_send`) against a scripted
2026-07-28 server over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from starlette.responses import Response

from approvals.models import McpServer, Round, ToolCall
from approvals.services import sending
from tests import factories
from tests.test_sends_hostile import TOOLS, ScriptedServer, asking, done

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


def _slow_state(rid: Any, params: dict[str, Any]) -> Response:
    time.sleep(1.5)  # the tool works a while, then asks to be called again with its state
    return asking({}, "after-a-while")(rid, params)


def _call(scripted: ScriptedServer, call_timeout: int) -> ToolCall:
    release = factories.team("release")
    agent, _ = factories.agent("ci-bot")
    server = McpServer.objects.create(
        slug="scripted",
        name="scripted",
        url=scripted.url,
        default_team=release,
        tools=TOOLS,
        call_timeout=call_timeout,
    )
    agent.servers.add(server)
    return factories.call(server, agent, tool="plain", arguments={})


@override_settings(ELICIT_MAX_CALL_TIMEOUT=4)
def test_a_state_only_round_after_a_long_send_is_left_to_a_new_task(scripted: ScriptedServer) -> None:
    scripted.script(_slow_state, done)
    call = _call(scripted, call_timeout=3)
    # 1.5 s spent, and the next send may take 3 more: past the 4 s one task has room for.
    assert sending.call_send(call_id=call.pk) == 0  # run_call retries at once, as a new task
    assert len(scripted.calls) == 1
    rnd = Round.objects.get(call=call)
    assert rnd.status == Round.Status.READY and rnd.send_attempts == 0
    call.refresh_from_db()
    assert call.status == ToolCall.Status.RESUMING

    assert sending.call_send(call_id=call.pk) is None
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert scripted.calls[-1]["requestState"] == "after-a-while"
    assert Round.objects.get(call=call).send_attempts == 1  # sent once, never taken for a redelivery


@override_settings(ELICIT_MAX_CALL_TIMEOUT=4)
def test_a_state_only_round_that_still_fits_is_sent_by_the_same_task(scripted: ScriptedServer) -> None:
    scripted.script(asking({}, "at-once"), done)
    call = _call(scripted, call_timeout=1)
    assert sending.call_send(call_id=call.pk) is None
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert len(scripted.calls) == 2
