"""Beat's recover_stuck queues again only work that is stuck: not the calls a holder process runs, nor a
retry waiting out its backoff."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import tasks
from approvals.models import Holder, McpServer, Round, ToolCall
from approvals.services import sending
from tests import factories
from tests.test_call_fate import TOOLS, Script, ScriptedServer


@pytest.mark.django_db
def test_recovery_leaves_the_calls_a_holder_runs_to_the_holder() -> None:
    """A long tool on a holder's session: no task acts on it. Before, every such call was queued again every
    minute while its tool ran: with a holder's thousand sessions, a thousand useless tasks a minute."""
    server = factories.server(era=McpServer.Era.HANDSHAKE)
    holder = Holder.objects.create(name="host:1:oncerev")
    held = factories.call(server, status=ToolCall.Status.RUNNING, holder=holder, attempts=1)
    waiting = factories.call(server, status=ToolCall.Status.QUEUED)  # its holders are woken again
    long_ago = timezone.now() - timedelta(minutes=10)
    ToolCall.objects.filter(pk__in=[held.pk, waiting.pk]).update(updated_at=long_ago)

    assert tasks.recover_stuck(grace_seconds=0) == 1
    held.refresh_from_db()
    assert (held.status, held.holder_id) == (ToolCall.Status.RUNNING, holder.pk)


@pytest.mark.django_db(transaction=True)
def test_a_retry_waiting_out_its_backoff_is_not_queued_again_early() -> None:
    """A round's retry refused with 429 and ``Retry-After`` waits out its countdown; beat's recovery must not
    send it at once meanwhile. Before, recovery judged a round by when it was answered: one answered more than
    90 s before (a slow queue, earlier retries) was queued again at once, past the server's Retry-After, and
    each such extra try used up one of the call's retries."""
    with ScriptedServer() as scripted:
        scripted.script = Script(steps=[("state_only",), ("status", 429, {"Retry-After": "30"})])
        server = factories.server(slug="scripted", url=scripted.url, tools=TOOLS)
        call = factories.call(server, tool="plain", arguments={})
        countdown = sending.call_send(call_id=call.pk)
    assert countdown is not None and countdown >= 30
    rnd = Round.objects.get(call=call)
    assert (rnd.status, rnd.send_attempts) == (Round.Status.READY, 1)
    Round.objects.filter(pk=rnd.pk).update(answered_at=timezone.now() - timedelta(minutes=10))

    assert tasks.recover_stuck() == 0  # beat's run, with its grace
    assert len(scripted.script.calls) == 2
