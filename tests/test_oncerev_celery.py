"""The Celery settings the exactly-once sends rely on, pinned by the app rather than left to Celery's
defaults, which a new Celery version may turn around."""

from __future__ import annotations

from elicit_hub.celery import app


def test_a_lost_broker_connection_never_cancels_a_send_in_flight() -> None:
    # Celery 6 changes this default to True: every running send would be cut at each Redis blip.
    assert "worker_cancel_long_running_tasks_on_connection_loss" in app.conf.changes
    assert app.conf.worker_cancel_long_running_tasks_on_connection_loss is False


def test_a_send_is_acknowledged_late_and_redelivered_when_its_worker_dies() -> None:
    assert app.conf.task_acks_late is True
    assert app.conf.task_reject_on_worker_lost is True
    assert app.conf.worker_prefetch_multiplier == 1
