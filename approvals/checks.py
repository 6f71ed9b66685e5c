"""System checks: settings that would break the hub's guarantees fail loudly at start-up."""

from __future__ import annotations

import os
import shutil
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register


@register()
def countdowns_below_visibility_timeout(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """A delayed Celery task longer than the broker's visibility timeout is redelivered to a second worker."""
    visibility = settings.CELERY_VISIBILITY_TIMEOUT
    countdowns = {
        "ELICIT_MCP_RETRY_MAX": settings.ELICIT_MCP_RETRY_MAX,
        "ELICIT_WEBHOOK_RETRY_MAX": settings.ELICIT_WEBHOOK_RETRY_MAX,
        "CELERY_TASK_TIME_LIMIT": settings.CELERY_TASK_TIME_LIMIT,
        "ELICIT_CALL_TASK_TIME_LIMIT (from ELICIT_MAX_CALL_TIMEOUT)": settings.ELICIT_CALL_TASK_TIME_LIMIT,
    }
    return [
        Error(
            f"{name} ({value} s) is not below the broker's visibility timeout ({visibility} s).",
            hint="Raise ELICIT_VISIBILITY_TIMEOUT or lower the countdown, or tasks may run twice.",
            id="approvals.E001",
        )
        for name, value in countdowns.items()
        if value >= visibility
    ]


@register()
def stdio_servers_run_unprivileged(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """A hub running as root runs stdio servers as ELICIT_STDIO_USER through setpriv; without either, no
    stdio server starts (never as root instead)."""
    from approvals.holder.stdio import RunAs

    if os.geteuid() != 0:
        return []
    problems = []
    try:
        RunAs.configured()
    except RuntimeError as exc:
        problems.append(str(exc))
    if shutil.which("setpriv") is None:
        problems.append("setpriv (util-linux) is not on PATH; stdio servers cannot drop root")
    return [
        Warning(
            problem,
            hint="stdio servers will not start until this is fixed; Streamable HTTP servers are unaffected.",
            id="approvals.W001",
        )
        for problem in problems
    ]


RATES = (
    "ELICIT_API_RATE",
    "ELICIT_API_ANON_RATE",
    "ELICIT_SIGN_IN_USER_RATE",
    "ELICIT_SIGN_IN_CLIENT_RATE",
    "ELICIT_AUDIT_EXPORT_RATE",
)


@register()
def rates_are_readable(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """A rate limit written so it cannot be read ("count/period": 600/m, 5/15m, 60/h) fails at start-up, not
    on every request it would limit."""
    from ninja.throttling import SimpleRateThrottle

    parse = SimpleRateThrottle.parse_rate
    problems = []
    for name in RATES:
        value = getattr(settings, name)
        try:
            count, period = parse(SimpleRateThrottle.__new__(SimpleRateThrottle), value)
        except (TypeError, ValueError):
            count, period = None, None
        if count is None or period is None or count < 1 or period < 1:
            problems.append(
                Error(
                    f"{name} is {value!r}: not a rate the hub can read.",
                    hint='Write it as "count/period": a positive count, then s, m, h or d (600/m, 5/15m).',
                    id="approvals.E002",
                )
            )
    return problems
