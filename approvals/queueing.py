"""Work for the Celery worker, queued by name once the surrounding transaction commits.

Services queue tasks through here and never import the task modules (the tasks import the services): the
names below are the contract between the two layers, and a test checks that each names a registered task.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from celery import current_app
from django.db import transaction

RUN_CALL = "approvals.tasks.run_call"
SEND_NOTIFICATION = "approvals.tasks.send_notification"
DELIVER_WEBHOOK = "approvals.tasks.deliver_webhook"

TASKS = (RUN_CALL, SEND_NOTIFICATION, DELIVER_WEBHOOK)

# Work under way goes first: a retry a person answered, an approved gate's send, a notification, a webhook
# (Celery's priority 0, the default). A call's first send is new work: when the workers fall behind, it waits
# behind all of those, so a reviewer's answer reaches its server in the time of a send, not behind every call
# submitted since. On Redis a lower number is served first: kombu keeps one list per priority step
# (0, 3, 6, 9) and a worker's BRPOP names them in that order.
UNDER_WAY = 0
NEW_WORK = 6


def enqueue_on_commit(task: str, *args: Any, priority: int = UNDER_WAY) -> None:
    """Queue ``task(*args)`` once the current transaction commits (at once outside one); none on rollback."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}")
    # robust: a broker that fails after the commit must not turn the committed request into an error;
    # the work is in PostgreSQL, and beat's recover_stuck queues it again. Django logs a robust callback's
    # failure by the callback's __qualname__, which a partial lacks: without one, the log line itself raised
    # (AttributeError) out of the commit, and the caller failed after all.
    send: Any = partial(current_app.send_task, task, args=args, priority=priority)
    send.__qualname__ = f"queueing.enqueue_on_commit({task}, {', '.join(map(str, args))})"
    transaction.on_commit(send, robust=True)
