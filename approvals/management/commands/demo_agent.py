from __future__ import annotations

from typing import Any

import httpx
from django.core.management.base import CommandError

from approvals.management.commands._cli import HubCommand
from approvals.management.commands.bootstrap_demo import token_file

DEMO_CALLS = [
    ("create_deployment", {"branch": "main"}),
    ("connect_account", {"service": "github"}),
    ("schedule_meeting", {}),
    ("echo", {"text": "hello from the demo agent"}),
    ("fail", {}),
]


class Command(HubCommand):
    help = "Submit one call of each demo tool through the hub's API, as an agent would."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--hub", default="http://127.0.0.1:8000")
        parser.add_argument("--token", default="", help="agent token (default: the demo agent's)")
        parser.add_argument("--server", default="demo")

    def handle(self, *args: Any, hub: str, token: str, server: str, **options: Any) -> None:
        if not token:
            path = token_file()
            if not path.exists():
                raise CommandError(
                    "no demo agent token for this database; run `manage.py bootstrap_demo` or pass --token"
                )
            token = path.read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        for tool, arguments in DEMO_CALLS:
            try:
                response = httpx.post(
                    f"{hub}/api/v1/calls",
                    headers=headers,
                    timeout=10,
                    json={"server": server, "tool": tool, "arguments": arguments},
                )
            except httpx.HTTPError as exc:
                raise CommandError(f"the hub at {hub} did not answer: {exc}") from None
            if response.status_code >= 400:
                raise CommandError(f"{tool}: {response.status_code} {response.text}")
            self.stdout.write(f"{tool}: call {response.json()['id']} {response.json()['status']}")
