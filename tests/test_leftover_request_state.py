"""A server's requestState (a secret) is kept only while the call may still echo it: beat forgets it once
the call is final, in bounded batches, and never while a retry may still need it (on the real PostgreSQL;
the beat task is called as beat would call it)."""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import connection, connections, transaction

from approvals import tasks
from approvals.models import Round, ToolCall
from approvals.services import calls, rounds, sending
from tests import factories

pytestmark = pytest.mark.django_db


def state_of(rnd: Round) -> str | None:
    return Round.objects.filter(pk=rnd.pk).values_list("request_state", flat=True).get()


def call_with_round(srv, status: str) -> Round:
    """A call whose round holds the server's requestState, the call then moved to `status` (a final one as
    the hub ends a call: `calls.call_finish`)."""
    call = factories.call(srv)
    rnd = factories.open_round(call, request_state=f"secret-{call.pk}")
    if status not in ToolCall.Status.finals():
        ToolCall.objects.filter(pk=call.pk).update(status=status)
        return rnd
    outcome = {
        ToolCall.Status.COMPLETED: {"result": {"content": [], "isError": False}},
        ToolCall.Status.FAILED: {"error": {"code": "outcome_unknown", "message": "may have run"}},
        ToolCall.Status.EXPIRED: {"error": {"code": "expired", "message": "no one answered"}},
    }.get(status, {})
    with transaction.atomic():
        assert calls.call_finish(call=call, status=status, **outcome)
    return rnd


def test_the_state_of_final_calls_is_forgotten_and_that_of_open_calls_kept() -> None:
    srv = factories.server()
    final = [
        call_with_round(srv, status)
        for status in (
            ToolCall.Status.COMPLETED,
            ToolCall.Status.FAILED,
            ToolCall.Status.EXPIRED,
            ToolCall.Status.CANCELLED,
        )
    ]
    kept = [
        call_with_round(srv, status)
        for status in (ToolCall.Status.AWAITING_INPUT, ToolCall.Status.RESUMING, ToolCall.Status.RUNNING)
    ]

    assert tasks.forget_request_states() == len(final)

    assert [state_of(rnd) for rnd in final] == [None] * len(final)
    assert [state_of(rnd) for rnd in kept] == [f"secret-{rnd.call_id}" for rnd in kept]
    assert tasks.forget_request_states() == 0  # nothing left to forget


def test_a_cancelled_call_forgets_it_and_a_retry_still_due_echoes_it() -> None:
    srv = factories.server()
    agent, _ = factories.agent(servers=[srv])
    cancelled = factories.open_round(factories.call(srv, agent), request_state="cancelled-secret")
    calls.call_cancel(agent=agent, call_id=cancelled.call_id)
    # An answered round waiting for its retry: the send claims it with its requestState intact.
    due = factories.open_round(factories.call(srv, agent), request_state="due-secret")
    Round.objects.filter(pk=due.pk).update(status=Round.Status.READY)
    ToolCall.objects.filter(pk=due.call_id).update(status=ToolCall.Status.RESUMING)

    assert tasks.forget_request_states() == 1

    assert state_of(cancelled) is None
    send = sending._claim(due.call_id)
    assert send is not None and send.round is not None and send.round.request_state == "due-secret"


def test_a_run_clears_bounded_batches_and_leaves_the_rest_to_the_next(monkeypatch) -> None:
    monkeypatch.setattr(rounds, "FORGET_BATCH", 2)
    monkeypatch.setattr(rounds, "FORGET_BATCHES", 2)
    srv = factories.server()
    final = [call_with_round(srv, ToolCall.Status.COMPLETED) for _ in range(5)]

    assert rounds.rounds_forget_state() == 4
    assert rounds.rounds_forget_state() == 1
    assert all(state_of(rnd) is None for rnd in final)


@pytest.mark.django_db(transaction=True)
def test_a_round_another_transaction_holds_is_skipped_not_waited_for() -> None:
    srv = factories.server()
    held, free = (call_with_round(srv, ToolCall.Status.COMPLETED) for _ in range(2))
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Round.objects.select_for_update(no_key=True).filter(pk=held.pk))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # a wait would fail the test, not hang it
        assert rounds.rounds_forget_state() == 1
        assert (state_of(held), state_of(free)) == (f"secret-{held.call_id}", None)
    finally:
        release.set()
        holder.join(30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert rounds.rounds_forget_state() == 1  # the next run takes it
    assert state_of(held) is None


def test_beat_runs_it_every_minute() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["forget-request-states"]
    assert entry == {"task": "approvals.tasks.forget_request_states", "schedule": 60.0}
