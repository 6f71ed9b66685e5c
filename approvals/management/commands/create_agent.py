from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.models import AgentClient, McpServer
from approvals.services import tokens


class Command(BaseCommand):
    help = "Create an agent and print its token (shown once; only its hash is stored)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--server", action="append", default=[], required=True)
        parser.add_argument("--owner", default="")
        parser.add_argument(
            "--webhook-secret", action="store_true", help="also create a webhook signing secret"
        )

    def handle(
        self, *args: Any, name: str, server: list[str], owner: str, webhook_secret: bool, **opts: Any
    ) -> None:
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
        if AgentClient.objects.filter(name=name).exists():
            raise CommandError(f"an agent named {name!r} exists already")
        agent, token = tokens.agent_create(
            name=name, servers=servers, owner=owner_user, with_webhook_secret=webhook_secret
        )
        self.stdout.write(f"agent {agent.name} may call: {', '.join(s.slug for s in servers)}")
        self.stdout.write(f"token: {token}")
        if webhook_secret:
            self.stdout.write(f"webhook secret: {agent.webhook_secret}")
        self.stdout.write("Store these now: they are not shown again.")
