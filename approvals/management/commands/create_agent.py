from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.db import IntegrityError

from approvals.audit.core import Actor
from approvals.management.commands._cli import HubCommand
from approvals.models import AgentClient, McpServer, Team
from approvals.services import tokens


class Command(HubCommand):
    help = "Create an agent and print its token (shown once; only its hash is stored)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--server", action="append", default=[], required=True)
        parser.add_argument("--owner", default="")
        parser.add_argument(
            "--webhook-secret", action="store_true", help="also create a webhook signing secret"
        )
        parser.add_argument(
            "--acts-for",
            action="append",
            default=[],
            metavar="USER|team:SLUG",
            help="a user, or every member of a team, the agent may name in on_behalf_of (repeatable)",
        )

    def handle(
        self,
        *args: Any,
        name: str,
        server: list[str],
        owner: str,
        webhook_secret: bool,
        acts_for: list[str],
        **opts: Any,
    ) -> None:
        name = name.strip()  # " ci-bot" would be a second agent that reads as "ci-bot"
        try:
            AgentClient._meta.get_field("name").clean(name, None)
        except ValidationError as exc:
            raise CommandError(f"the agent's name: {' '.join(exc.messages)}") from None
        servers = list(McpServer.objects.filter(slug__in=server))
        missing = set(server) - {s.slug for s in servers}
        if missing:
            raise CommandError(
                f"unknown server(s): {', '.join(sorted(missing))}; register them with add_server"
            )
        owner_user = None
        if owner:
            owner_user = get_user_model().objects.filter(username=owner).first()
            if owner_user is None:
                raise CommandError(f"no user named {owner!r}")
        users, teams = _people(acts_for)
        exists = CommandError(f"an agent named {name!r} exists already")
        if AgentClient.objects.filter(name=name).exists():
            raise exists
        try:
            agent, token = tokens.agent_create(
                name=name,
                servers=servers,
                owner=owner_user,
                with_webhook_secret=webhook_secret,
                acts_for_users=users,
                acts_for_teams=teams,
                actor=Actor.system("manage.py create_agent"),
            )
        except IntegrityError:
            # Created meanwhile by another run with the same name (the check above saw none yet).
            if AgentClient.objects.filter(name=name).exists():
                raise exists from None
            raise
        self.stdout.write(f"agent {agent.name} may call: {', '.join(s.slug for s in servers)}")
        people = [u.username for u in users] + [f"team:{t.slug}" for t in teams]
        self.stdout.write(f"it may act for: {', '.join(people) if people else 'no one'}")
        self.stdout.write(f"token: {token}")
        if webhook_secret:
            self.stdout.write(f"webhook secret: {agent.webhook_secret}")
        self.stdout.write("Store these now: they are not shown again.")


def _people(names: list[str]) -> tuple[list[Any], list[Team]]:
    """``--acts-for`` values: user names and ``team:SLUG``; every one must exist."""
    users, teams = [], []
    for raw in names:
        value = raw.strip()
        if value.startswith("team:"):
            team = Team.objects.filter(slug=value.removeprefix("team:")).first()
            if team is None:
                raise CommandError(f"--acts-for: no team with the slug {value.removeprefix('team:')!r}")
            teams.append(team)
        else:
            user = get_user_model().objects.filter(username=value).first()
            if user is None:
                raise CommandError(f"--acts-for: no user named {value!r} (use team:SLUG for a team)")
            users.append(user)
    return users, teams
