"""The periodic chain check: walks the whole audit chain and keeps the result for the audit page.

The lead wires it into beat as ``approvals.audit.tasks.verify_chain``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.core.cache import cache
from django.utils import timezone

from approvals.audit import core as audit

logger = logging.getLogger(__name__)
CHAIN_STATE_KEY = "audit:chain-state"


def store_chain_state(report: audit.ChainReport) -> dict[str, Any]:
    state = {
        "ok": report.ok,
        "checked": report.checked,
        "first_bad_id": report.first_bad_id,
        "problem": report.problem,
        "head_id": report.head_id,
        "head_hash": report.head_hash,
        "anchor": report.anchor,
        "checked_at": timezone.now().isoformat(),
    }
    cache.set(CHAIN_STATE_KEY, state, timeout=None)
    return state


def last_chain_state() -> dict[str, Any] | None:
    return cache.get(CHAIN_STATE_KEY)


# A full walk takes about a minute per million events: longer than the default task limits.
@shared_task(soft_time_limit=1800, time_limit=1900)
def verify_chain() -> dict[str, Any]:
    report = audit.verify()
    if not report.ok:
        logger.error("audit chain broken at event #%s: %s", report.first_bad_id, report.problem)
    return store_chain_state(report)
