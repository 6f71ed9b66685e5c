"""Retention: remove audit events older than ELICIT_AUDIT_RETENTION_DAYS, and record what was removed.

    manage.py prune_audit                 # older than the retention setting
    manage.py prune_audit --days 90       # or an explicit age, or --before 2026-01-01T00:00:00+00:00
    manage.py prune_audit --dry-run       # say what would go, remove nothing

Only the oldest part of the chain goes. An ``audit.pruned`` event records the id range, the count and the hash
of the last removed event; the first kept event links to that hash, so ``verify_audit`` still passes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from approvals.audit import core as audit
from approvals.management.commands._cli import HubCommand


class Command(HubCommand):
    help = "Remove audit events past the retention period, recording the removed range and its hash."

    def add_arguments(self, parser: CommandParser) -> None:
        age = parser.add_mutually_exclusive_group()
        age.add_argument("--days", type=int, help="remove events older than this many days")
        age.add_argument("--before", help="remove events older than this ISO 8601 time")
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        before = self._cutoff(options)
        try:
            result = audit.prune(
                before=before, actor=audit.Actor.system("prune_audit"), dry_run=options["dry_run"]
            )
        except audit.ChainBroken as exc:
            raise CommandError(
                f"refusing to prune: the chain to be removed does not verify ({exc}). Run verify_audit."
            ) from None
        if result is None:
            self.stdout.write(f"nothing to remove: no event is older than {before.isoformat()}")
            return
        what = f"{result.count} events #{result.first_id}..#{result.last_id} (last hash {result.last_hash})"
        if result.event is None:
            self.stdout.write(f"would remove {what}")
        else:
            self.stdout.write(f"removed {what}; recorded as event #{result.event.id}")

    def _cutoff(self, options: dict[str, Any]) -> datetime:
        if options["before"]:
            try:
                before = parse_datetime(options["before"])
            except ValueError:  # well-formed but no such time: 2026-02-30
                before = None
            if before is None:
                raise CommandError(f"--before must be an ISO 8601 time, not {options['before']!r}")
            before = before if timezone.is_aware(before) else timezone.make_aware(before)
            if before > timezone.now():
                # Would remove the whole log, the newest events too: a mistyped year, never a retention.
                raise CommandError(f"--before {options['before']!r} lies in the future")
            return before
        days = options["days"] if options["days"] is not None else self._retention_days()
        if days < 1:
            raise CommandError("the retention period must be at least 1 day")
        try:
            return timezone.now() - timedelta(days=days)
        except OverflowError:
            raise CommandError(f"{days} days reaches before the year 1; give a smaller number") from None

    def _retention_days(self) -> int:
        days = getattr(settings, "ELICIT_AUDIT_RETENTION_DAYS", 365)
        if not isinstance(days, int):
            raise CommandError("ELICIT_AUDIT_RETENTION_DAYS must be a whole number of days")
        return days
