from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from approvals.audit import core as audit
from approvals.management.commands._cli import HubCommand
from approvals.models import AuditEvent


class Command(HubCommand):
    help = (
        "Walk the audit log's hash chain and name the first row that does not match; check that the head the "
        "previous check recorded (or the one given with --head) is still there."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--head", type=Path, help="a head saved by export_audit_head: check its event still has that hash"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit.check_chain()
        audit.store_chain_state(report)
        if not report.ok:
            raise CommandError(
                f"audit chain broken at event #{report.first_bad_id}: {report.problem} "
                f"({report.checked} events before it verified)"
            )
        if options["head"]:
            try:
                saved = json.loads(options["head"].read_text())
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read the saved head: {exc}") from None
            if not _is_head(saved):
                raise CommandError(
                    f"{options['head']} is not a head saved by export_audit_head "
                    "(a JSON object with head_id and head_hash)"
                )
            if not audit.head_matches(saved):
                if not AuditEvent.objects.filter(pk=saved["head_id"]).exists():
                    raise CommandError(
                        f"event #{saved['head_id']}, the saved head, is gone and no prune removed it: the "
                        "events from it on were cut"
                    )
                raise CommandError(
                    f"event #{saved.get('head_id')} no longer has the saved hash: the chain was rewritten"
                )
            self.stdout.write(f"saved head #{saved.get('head_id')} matches")
        elif report.recorded_head_id is not None:
            self.stdout.write(f"the head the last check recorded (#{report.recorded_head_id}) is still there")
        self.stdout.write(f"audit chain intact: {report.checked} events verified")


def _is_head(saved: object) -> bool:
    """Whether `saved` reads as `export_audit_head` output: anything else (a list, an object without the
    head, an id that is not a whole number) would otherwise "match" or fail with a traceback."""
    if not isinstance(saved, dict) or "head_id" not in saved or not isinstance(saved.get("head_hash"), str):
        return False
    head_id = saved["head_id"]
    return head_id is None or (isinstance(head_id, int) and not isinstance(head_id, bool))
