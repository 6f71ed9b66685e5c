"""The periodic chain checks beat runs: hourly, the events since the head the previous check recorded (and
that head unchanged, so a cut tail or a rewritten head shows); daily, the whole chain. Each keeps its result
for the audit page (``audit.check_chain``)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from approvals.audit import core as audit

logger = logging.getLogger(__name__)


# A full walk takes about a minute per million events: longer than the default task limits.
@shared_task(soft_time_limit=1800, time_limit=1900)
def verify_chain(full: bool = False) -> dict[str, Any]:
    state = audit.store_chain_state(audit.check_chain(full=full))
    if not state["ok"]:  # also while a break the last full walk found stands: every check says so
        logger.error("audit chain broken at event #%s: %s", state["first_bad_id"], state["problem"])
    return state


@shared_task(name="approvals.audit_tasks.verify_chain", soft_time_limit=1800, time_limit=1900)
def verify_chain_former_name() -> dict[str, Any]:
    """The task's name before the audit package, kept for one release for messages already queued."""
    return verify_chain(full=True)
