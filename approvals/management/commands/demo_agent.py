from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
from django.core.management.base import CommandError

from approvals.management.commands._cli import HubCommand, shown
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
        if not _http_url(hub):
            raise CommandError(f"--hub: {shown(hub)[:100]!r} is not an http(s) URL")
        hub = hub.rstrip("/")
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
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise CommandError(f"the hub at {shown(hub)} did not answer: {shown(exc)}") from None
            call = _json(response)
            if response.status_code >= 400 or call.get("id") is None:
                raise CommandError(f"{tool}: the hub at {shown(hub)} answered {_refusal(response, call)}")
            self.stdout.write(f"{tool}: call {shown(call['id'])} {shown(call.get('status'))}")


def _http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a malformed address or port
        return False


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _refusal(response: httpx.Response, body: dict[str, Any]) -> str:
    """The status and, from the hub's JSON error, its code and message; never a page of HTML."""
    error = body.get("error")
    if isinstance(error, dict):
        return shown(f"{response.status_code}: {error.get('code')}: {error.get('message')}")[:300]
    return f"{response.status_code} ({shown(response.headers.get('content-type') or 'no content type')[:60]})"
