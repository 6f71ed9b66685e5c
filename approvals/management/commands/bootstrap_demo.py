from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from approvals.models import AgentClient, McpServer, Membership, Team
from approvals.services import tokens

TOKEN_FILE = Path(settings.BASE_DIR) / "var" / "demo-agent.token"


class Command(BaseCommand):
    help = "Set up the demo: an admin user (login printed once), the demo MCP server, a team and an agent."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        admin = User.objects.filter(username="admin").first()
        if admin is None:
            password = secrets.token_urlsafe(12)
            admin = User.objects.create_superuser("admin", "admin@example.com", password)
            self.stdout.write(self.style.SUCCESS(f"Demo login (shown once): admin / {password}"))
        team, _ = Team.objects.get_or_create(slug="release", defaults={"name": "Release managers"})
        Membership.objects.get_or_create(team=team, user=admin, defaults={"role": Membership.Role.ADMIN})
        call_command(
            "add_server",
            "demo",
            settings.ELICIT_DEMO_MCP_URL,
            name="Demo deploy server",
            team="release",
            stdout=self.stdout,
        )
        if not AgentClient.objects.filter(name="demo-agent").exists() or not TOKEN_FILE.exists():
            AgentClient.objects.filter(name="demo-agent").delete()
            _, token = tokens.agent_create(
                name="demo-agent", servers=[McpServer.objects.get(slug="demo")], with_webhook_secret=True
            )
            TOKEN_FILE.parent.mkdir(parents=True, exist_ok=True)
            TOKEN_FILE.touch(mode=0o600)
            TOKEN_FILE.write_text(token)
            self.stdout.write("demo agent created (its token is kept in var/ for `manage.py demo_agent`)")
