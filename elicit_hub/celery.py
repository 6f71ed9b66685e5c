"""The Celery app: JSON only, late acks, redelivery when a worker dies, time limits (see settings)."""

import os
import sys
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")

app = Celery("elicit_hub")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection before and after each task, and in a prefork child
# with Django's connection pool it closes the whole pool too (`close_pool`): each task then opened new
# PostgreSQL connections (a new server process each, the largest CPU cost of a send). Never recycle the pool
# per task; `close_old_connections` below hands the connection back to the pool instead, as a request does.
# The fixup still closes what a child inherited from its parent when it starts.
app.conf["CELERY_DB_REUSE_MAX"] = sys.maxsize
# A broker connection lost while a task runs: the task runs on (its message comes back, and the call's send
# lock makes that copy a no-op). Celery 6 turns the default around and cancels such tasks: a send cut mid-way
# would end `outcome_unknown`, or be sent again, on every Redis blip. Pinned, whatever the version's default.
app.conf.worker_cancel_long_running_tasks_on_connection_loss = False
app.autodiscover_tasks()


def _hub_log_level() -> str:
    from django.conf import settings

    return str(settings.ELICIT_LOG_LEVEL)


def _follow_the_hub_log_level() -> None:
    """A worker started without ``--loglevel`` logs at ELICIT_LOG_LEVEL, as the hub's other processes do:
    Celery's own default (WARNING) replaces the root logger's level that Django's LOGGING set, in the worker
    and its pool. An explicit ``--loglevel`` still wins. Read when the worker's command line is parsed (after
    this module is imported), so importing the app never loads the settings."""
    command = sys.modules.get("celery.bin.worker")  # imported only when this process is Celery's CLI
    if command is None:
        return
    for param in command.worker.params:
        if param.name == "loglevel":
            param.default = _hub_log_level


_follow_the_hub_log_level()


@worker_init.connect
@worker_process_init.connect
def _settle(**kwargs: Any) -> None:
    """The worker's code leaves the garbage collector's way (``elicit_hub.heap``): in the parent before it
    forks its pool, and again in each child once forked (what the parent loaded after its own settle)."""
    from elicit_hub import heap

    heap.settle()


@task_prerun.connect
@task_postrun.connect
def _return_connections(**kwargs: Any) -> None:
    """Before and after each task: give the database connection back to the process's pool (CONN_MAX_AGE 0),
    or close it when it is unusable; the pool checks a connection's health as it hands it out."""
    from django.db import close_old_connections

    close_old_connections()
