from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import URLValidator

from approvals import netguard
from approvals.models import McpServer, Team
from approvals.services.servers import parse_header_lines, probe_summary, server_probe


class Command(BaseCommand):
    help = "Register (or update) an MCP server the hub may call."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("slug")
        parser.add_argument("url")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--team", default="", help="slug of the team that answers its requests by default"
        )
        parser.add_argument(
            "--header", action="append", default=[], help='"Name: value", sent with every request'
        )
        parser.add_argument(
            "--era",
            choices=McpServer.Era.values,
            default=None,
            help="protocol era to speak (default: auto, or the setting of a server already registered)",
        )
        parser.add_argument(
            "--no-probe", action="store_true", help="register without asking the server anything"
        )

    def handle(
        self,
        *args: Any,
        slug: str,
        url: str,
        name: str,
        team: str,
        header: list[str],
        era: str | None,
        no_probe: bool,
        **options: Any,
    ) -> None:
        try:
            URLValidator(schemes=["http", "https"])(url)
        except ValidationError:
            raise CommandError(f"{url!r} is not an http(s) URL.") from None
        try:
            netguard.check_url(url)
        except netguard.Refused as exc:
            raise CommandError(
                f"the server URL is refused: {exc.message} (ELICIT_OUTBOUND_ALLOW lists exceptions)"
            ) from None
        try:
            headers = parse_header_lines(header)
        except ValueError as exc:
            raise CommandError(f'--header must look like "Name: value", got {str(exc)!r}...') from None
        default_team = None
        if team:
            default_team, _ = Team.objects.get_or_create(
                slug=team, defaults={"name": team.replace("-", " ").title()}
            )
        server, created = McpServer.objects.update_or_create(
            slug=slug,
            defaults={
                "url": url,
                "name": name or slug.replace("-", " ").title(),
                "default_team": default_team,
                **({"headers": headers} if headers else {}),
                **({"era": era} if era else {}),
            },
        )
        verb = "registered" if created else "updated"
        self.stdout.write(
            f"{verb} MCP server {server.slug} at {server.url}"
            + (f" ({len(headers)} header(s))" if headers else "")
            + f", era {server.era}"
        )
        if no_probe:
            return
        found = server_probe(server)
        self.stdout.write(f"probe: {probe_summary(found)}")
        if not found["ok"]:
            error = found.get("error") or {}
            self.stdout.write(f"error: {error.get('code')}: {error.get('message')}")
            if found.get("hint"):
                self.stdout.write(f"hint: {found['hint']}")
            self.stdout.write(
                "the server is registered all the same; `manage.py check_server` probes it again"
            )
