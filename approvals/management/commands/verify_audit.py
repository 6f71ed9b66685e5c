from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from approvals.audit import core as audit
from approvals.management.commands._cli import HubCommand, shown
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
            self.stdout.write(_saved_head(saved))
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


def _saved_head(saved: dict[str, Any]) -> str:
    """What a saved head says of the chain now; CommandError when it shows the chain was rewritten or cut."""
    head_id = saved["head_id"]
    if head_id is None:
        return "the saved head is of an empty chain: it vouches for nothing"
    current = AuditEvent.objects.filter(pk=head_id).values_list("hash", flat=True).first()
    if current == saved["head_hash"]:
        return f"saved head #{head_id} matches"
    if current is not None:
        raise CommandError(f"event #{head_id} no longer has the saved hash: the chain was rewritten")
    prune = audit.removing_prune(head_id)
    if prune is None:
        raise CommandError(
            f"event #{head_id}, the saved head, is gone and no prune removed it: the events from it on were "
            "cut"
        )
    if problem := _contradiction(saved, prune.data):
        raise CommandError(
            f"event #{head_id}, the saved head, is gone, and the audit.pruned event #{prune.id} that would "
            f"have removed it {problem}: that prune was not the hub's retention, the events through "
            f"#{shown(prune.data.get('last_id'))} were cut"
        )
    # Any session that may write the table can record a prune; only whoever ran it can say it was theirs, and
    # what its record says is printed as a terminal cannot obey (a forged one may hold escape sequences).
    return (
        f"saved head #{head_id} was removed by a prune (audit.pruned event #{prune.id}, by "
        f"{shown(repr(prune.actor_label))} at {prune.at.isoformat()}, through "
        f"#{shown(prune.data.get('last_id'))}, of events before {shown(prune.data.get('before'))[:100]}): it "
        "vouches for nothing left; save a newer head, and if no one here ran that prune, the events it names "
        "were cut"
    )


def _contradiction(saved: dict[str, Any], pruned: dict[str, Any]) -> str:
    """What in a prune's record cannot be true of the saved head it removed, if anything: the hub's retention
    records the hash of the last event it removes, and removes only events older than its ``before``."""
    head_id = saved["head_id"]
    if pruned.get("last_id") == head_id and pruned.get("last_hash") != saved["head_hash"]:
        return "records another hash for it"
    if not (isinstance(pruned.get("first_id"), int) and pruned["first_id"] <= head_id):
        return ""  # a later prune's record: the one that removed the saved head is gone with it
    try:
        head_at = datetime.fromisoformat(str(saved.get("head_at")))
        before = datetime.fromisoformat(str(pruned.get("before")))
        newer = head_at >= before
    except (TypeError, ValueError):
        return ""  # a head saved without its time, or a record without one: nothing to compare
    if not newer:
        return ""
    return f"says it removed only events before {before.isoformat()}, and it is from {head_at.isoformat()}"
