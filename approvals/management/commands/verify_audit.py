from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from approvals import audit


class Command(BaseCommand):
    help = "Walk the audit log's hash chain and name the first row that does not match."

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit.verify()
        if not report.ok:
            raise CommandError(
                f"audit chain broken at event #{report.first_bad_id}: {report.problem} "
                f"({report.checked} events before it verified)"
            )
        self.stdout.write(f"audit chain intact: {report.checked} events verified")
