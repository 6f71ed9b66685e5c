"""Print the audit chain's head (newest id and hash) as JSON, to keep outside the database.

manage.py export_audit_head > audit-head-$(date +%F).json
manage.py verify_audit --head audit-head-2026-12-01.json      # later: has anything been rewritten?
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from approvals.audit import core as audit
from approvals.management.commands._cli import HubCommand


class Command(HubCommand):
    help = "Print the audit chain head as JSON (verified first unless --no-verify)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-verify", action="store_true", help="skip walking the chain first")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["no_verify"]:
            # The chain compared with the head the last check recorded, too: a chain whose newest events were
            # cut still verifies, and its cut head must not be saved as the one to trust.
            report = audit.check_chain()
            if not report.ok:
                raise CommandError(f"audit chain broken at event #{report.first_bad_id}: {report.problem}")
        self.stdout.write(json.dumps(audit.chain_head(), indent=2))
