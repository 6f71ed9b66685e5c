"""Chaos around the record of a send: the worker's PostgreSQL session is lost while the server runs the tool
(a restart, a failover, an administrator ending it). The server's answer is in the worker's hands: it is
recorded once PostgreSQL answers again, never lost to ``outcome_unknown``, and the tool runs once."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from approvals import tasks
from approvals.models import AuditEvent, Round, ToolCall
from elicit_hub.postgres.base import APPLICATION_NAME
from tests import demo_support
from tests.hub import set_up_hub
from tests.live import wait_until
from tests.test_crash_safety import retries_sent

pytestmark = pytest.mark.timeout(180)


def _end_sessions_of(pid: int) -> int:
    """End every PostgreSQL session of process `pid`, as a server restart does for that process."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [APPLICATION_NAME.format(pid=pid)],
        )
        (ended,) = cursor.fetchone()
    return int(ended)


def _deploy_and_hold_the_answer(hub: Any, demo_url: str) -> str:
    """A call whose retry the server runs, then holds the answer of for a few seconds; returns its id once
    the tool has run."""
    call_id = hub.agent.call("create_deployment", {"branch": "hotfix"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    demo_support.hold(demo_url, "create_deployment", "after", 4)
    assert hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200
    wait_until(
        lambda: demo_support.executions(demo_url).get("create_deployment") == 1, 30, what="the tool to run"
    )
    return call_id


def test_a_lost_database_session_mid_send_still_records_the_answer(worker, demo_server) -> None:
    """A tool that is not safe to repeat: before, the worker failed on its dead session and the answer it held
    was lost; the call then ended ``outcome_unknown`` although the server had answered."""
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url, honours_idempotency_key=False)
    call_id = _deploy_and_hold_the_answer(hub, demo_server.url)
    assert _end_sessions_of(worker.proc.pid) >= 1

    def finished() -> bool:
        tasks.recover_stuck(grace_seconds=0)  # what beat does every minute; it must not re-send the call
        return ToolCall.objects.get(pk=call_id).is_final

    wait_until(finished, 60, 0.5, what="the call to finish")
    call = ToolCall.objects.get(pk=call_id)
    assert call.status == ToolCall.Status.COMPLETED, call.error
    assert call.result["isError"] is False
    assert Round.objects.get(call_id=call_id, number=1).status == Round.Status.CLOSED
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    assert len(retries_sent(demo_server.url)) == 1
    assert not AuditEvent.objects.filter(call_id=call_id, verb="round.resent").exists()
    shown = hub.agent.get(f"/calls/{call_id}").json()
    assert shown["status"] == "completed"
