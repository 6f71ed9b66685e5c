from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, transaction

from approvals import urlsafety
from approvals.audit.core import Actor
from approvals.management.commands._cli import HubCommand, shown
from approvals.models import AgentClient, McpServer, Membership, Team
from approvals.services import config_audit, tokens
from approvals.services.servers import probe_summary, server_probe
from elicit_hub import engines

# Where `make run` keeps its state (ELICIT_VAR_DIR, else ./var), beside the embedded engines.
VAR_DIR: Path = engines.VAR_DIR
ACTOR = Actor.system("manage.py bootstrap_demo")


def token_file() -> Path:
    """Where the demo agent's token is kept: one file per database, since a token belongs to the database
    that stores its hash (``make run`` may run against the embedded engines or a DATABASE_URL)."""
    db = connection.settings_dict
    where = f"{db.get('HOST') or ''}|{db.get('PORT') or ''}|{db['NAME']}"
    return VAR_DIR / f"demo-agent.{hashlib.sha256(where.encode()).hexdigest()[:12]}.token"


class Command(HubCommand):
    help = "Set up the demo: an admin user (login printed once), the demo MCP server, a team and an agent."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        admin = User.objects.filter(username="admin").first()
        if admin is None:
            password = secrets.token_urlsafe(12)
            admin = User.objects.create_superuser("admin", "admin@example.com", password)
            self.stdout.write(self.style.SUCCESS(f"Demo login (shown once): admin / {password}"))
        team, _ = config_audit.get_or_create(
            Team, actor=ACTOR, slug="release", defaults={"name": "Release managers"}
        )
        config_audit.get_or_create(
            Membership, actor=ACTOR, team=team, user=admin, defaults={"role": Membership.Role.ADMIN}
        )
        self.register_demo_server()
        # The demo server answers a re-sent tools/call with the same Idempotency-Key without running it again.
        with transaction.atomic():
            demo = McpServer.objects.select_for_update().get(slug="demo")
            if not demo.honours_idempotency_key:
                before = config_audit.state(demo)
                demo.honours_idempotency_key = True
                demo.save(update_fields=["honours_idempotency_key"])
                config_audit.saved(demo, before, actor=ACTOR)
        path = token_file()
        kept = path.read_text().strip() if path.exists() else ""
        agent = AgentClient.objects.filter(name="demo-agent").first()
        if agent is not None and tokens.token_matches(agent, kept):
            return
        if agent is None:
            agent, token = tokens.agent_create(
                name="demo-agent",
                servers=[McpServer.objects.get(slug="demo")],
                with_webhook_secret=True,
                actor=ACTOR,
            )
            self.stdout.write("demo agent created (its token is kept in var/ for `manage.py demo_agent`)")
        else:
            # The kept token is missing or belongs to another database: give the agent a new one (it may
            # have calls, so it is never deleted).
            token = tokens.agent_token_rotate(agent=agent, actor=ACTOR)
            self.stdout.write("demo agent has a new token (kept in var/ for `manage.py demo_agent`)")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.touch(mode=0o600)
        path.write_text(token)

    def register_demo_server(self) -> None:
        """Register the demo MCP server, or, when it is registered already at its URL, probe it again and
        keep what an admin changed since (its name, default team, era, headers)."""
        url = settings.ELICIT_DEMO_MCP_URL
        demo = McpServer.objects.filter(slug="demo").first()
        if demo is None or (demo.transport, demo.url) != (McpServer.Transport.HTTP, url):
            call_command(
                "add_server", "demo", url, name="Demo deploy server", team="release", stdout=self.stdout
            )
            return
        found = server_probe(demo, actor=ACTOR)
        self.stdout.write(f"MCP server demo at {shown(urlsafety.shown(url))}, era {demo.era}")
        self.stdout.write(f"probe: {shown(probe_summary(found))}")
        if not found["ok"]:
            error = found.get("error") or {}
            self.stdout.write(f"error: {shown(error.get('code'))}: {shown(error.get('message'))}")
