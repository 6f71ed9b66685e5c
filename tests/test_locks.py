"""Row locks and foreign keys: a row that references a locked call can still be committed.

The hub's foreign keys are checked at COMMIT (Django makes them DEFERRABLE INITIALLY DEFERRED), after the
transaction has appended its audit event under the audit chain's lock. A grant made as its call is being
sent did exactly that while the send held the call FOR UPDATE, which blocks the foreign-key check's KEY
SHARE; the send then asked for the chain's lock for its own audit event, and PostgreSQL found a deadlock
(the reviewer got a 503). Every row lock is now FOR NO KEY UPDATE. Real PostgreSQL, two connections.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction

from approvals import mcp_client
from approvals.audit import core as audit
from approvals.models import Grant, ToolCall
from approvals.services import grants, sending
from tests import factories

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.timeout(60)]


def test_a_grant_made_while_its_call_s_answer_is_applied_commits_without_a_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    server = factories.server("deploy", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[server])
    call = factories.call(server, agent, status=ToolCall.Status.RUNNING)
    locked, granted = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}
    record = audit.record

    def record_once_the_grant_is_in(**kwargs: Any) -> Any:
        if kwargs.get("verb") == "call.completed":
            # Inside `_apply`'s transaction, after the UPDATE that ends the call (and locks its row), before
            # its audit event.
            locked.set()
            outcome["grant_committed_meanwhile"] = granted.wait(timeout=5)
        return record(**kwargs)

    monkeypatch.setattr(audit, "record", record_once_the_grant_is_in)

    def apply() -> None:
        try:
            send = sending.Send(ToolCall.objects.select_related("server").get(pk=call.pk), None)
            completed = mcp_client.Completed(result={"content": [], "isError": False})
            outcome["applied"] = sending._apply(send, completed, received_at=None)
        except Exception as exc:  # a deadlock would land here (or in the grant's commit)
            outcome["apply_error"] = repr(exc)
        finally:
            connections.close_all()

    sender = threading.Thread(target=apply)
    sender.start()
    assert locked.wait(timeout=10)
    try:
        # The send holds the call's row lock now: a second writer cannot take it.
        with pytest.raises(OperationalError, match="could not obtain lock"), transaction.atomic():
            ToolCall.objects.select_for_update(nowait=True, no_key=True).filter(pk=call.pk).first()
        grants.create_from_approval(
            approver=alice, call=call, tool_digest="0" * 64, choice={"for": "1h", "arguments": "exact"}
        )
    finally:
        granted.set()
        sender.join(timeout=30)

    assert outcome.get("apply_error") is None
    assert outcome["grant_committed_meanwhile"] is True
    assert Grant.objects.filter(source_call=call).count() == 1
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMPLETED
