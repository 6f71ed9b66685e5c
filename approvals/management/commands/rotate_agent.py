from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError

from approvals.audit.core import Actor
from approvals.management.commands._cli import HubCommand, shown
from approvals.models import AgentClient
from approvals.services import tokens

ACTOR = Actor.system("manage.py rotate_agent")
# The longest overlap: a week covers a receiver's deploy cycle; an old secret kept longer is one that leaked.
MAX_OVERLAP_HOURS = 7 * 24


def overlap_hours(value: str) -> float:
    """An argparse type: hours (0 to a week) the replaced secret keeps signing beside the new one."""
    try:
        hours = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hours: {value[:40]!r}") from None
    if not 0 <= hours <= MAX_OVERLAP_HOURS:  # NaN fails both
        raise argparse.ArgumentTypeError(f"{value[:40]} is not between 0 and {MAX_OVERLAP_HOURS} hours")
    return hours


class Command(HubCommand):
    help = (
        "Give an agent a new API token (the old one stops at once) and/or a new webhook signing secret (the "
        "old one keeps signing beside it for --keep-previous-secret-for hours). Shown once."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="the agent's name")
        parser.add_argument("--token", action="store_true", help="a new API token; the old one stops at once")
        parser.add_argument(
            "--webhook-secret", action="store_true", help="a new webhook signing secret (one if it had none)"
        )
        parser.add_argument(
            "--keep-previous-secret-for",
            type=overlap_hours,
            default=24.0,
            metavar="HOURS",
            help="hours the replaced secret still signs, beside the new one (default 24; 0 if it leaked)",
        )

    def handle(
        self,
        *args: Any,
        name: str,
        token: bool,
        webhook_secret: bool,
        keep_previous_secret_for: float,
        **opts: Any,
    ) -> None:
        if not (token or webhook_secret):
            raise CommandError("say what to rotate: --token, --webhook-secret, or both")
        agent = AgentClient.objects.filter(name=name).first()
        if agent is None:
            raise CommandError(f"no agent named {shown(name)!r}")
        if token:
            self.stdout.write(f"token: {tokens.agent_token_rotate(agent=agent, actor=ACTOR)}")
            self.stdout.write("The old token no longer works.")
        if webhook_secret:
            secret, until = tokens.webhook_secret_rotate(
                agent=agent, keep_previous_for=timedelta(hours=keep_previous_secret_for), actor=ACTOR
            )
            self.stdout.write(f"webhook secret: {secret}")
            if until is not None:
                self.stdout.write(
                    f"Until {until.isoformat(timespec='seconds')} webhooks carry a signature by each secret."
                )
            else:
                self.stdout.write("Webhooks are signed by the new secret only, from now on.")
        self.stdout.write("Store it now: it is not shown again.")
        if not agent.is_active:
            # The API refuses a deactivated agent's token: say so, or the new one reads as working.
            self.stdout.write(
                f"{shown(agent.name)} is deactivated: its token works once it is active again (the admin's "
                "Agents)."
            )
