from __future__ import annotations

import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.core.validators import URLValidator
from django.db import transaction
from django.db.models import Field, Model

from approvals import netguard, urlsafety
from approvals.audit.core import Actor
from approvals.management.commands._cli import HubCommand, shown
from approvals.models import McpServer, Team, TeamSlug, validate_server_slug
from approvals.services import config_audit
from approvals.services import stdio as stdio_rules
from approvals.services.servers import LEARNED, parse_header_lines, probe_summary, server_probe

# Registering a URL makes the server a Streamable HTTP one: no command, arguments or environment stay.
NOT_STDIO = {"transport": McpServer.Transport.HTTP, "command": "", "args": [], "env": {}}
ACTOR = Actor.system("manage.py add_server")
SECRETS_MAX = 64 * 1024  # bytes read from stdin by --secrets-stdin


class Command(HubCommand):
    help = "Register (or update) an MCP server the hub may call."
    stealth_options = ("stdin",)  # call_command(..., stdin=...) stands in for the process's stdin

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("slug")
        parser.add_argument("url", nargs="?", default="", help="a Streamable HTTP server's URL")
        parser.add_argument(
            "--name", default="", help="how reviewers see it (default: its slug, or the name already set)"
        )
        parser.add_argument(
            "--team",
            default="",
            help="slug of the team that answers its requests by default (default: none, or the team already "
            "set)",
        )
        parser.add_argument(
            "--header", action="append", default=[], help='"Name: value", sent with every request'
        )
        parser.add_argument("--clear-headers", action="store_true", help="remove the stored headers")
        stdio = parser.add_argument_group("stdio servers (a command the hub runs, instead of a URL)")
        stdio.add_argument("--command", default="", help="an absolute path, or a name found on PATH")
        stdio.add_argument(
            "--arg",
            action="append",
            default=[],
            help='one argument (repeat for more; --arg=-x for one starting with "-")',
        )
        stdio.add_argument(
            "--env", action="append", default=[], help='"NAME=value" in its environment (repeat for more)'
        )
        stdio.add_argument("--clear-env", action="store_true", help="remove the stored environment")
        parser.add_argument(
            "--era",
            choices=McpServer.Era.values,
            default=None,
            help="protocol era to speak (default: auto, or the setting of a server already registered)",
        )
        parser.add_argument(
            "--no-probe", action="store_true", help="register without asking the server anything"
        )
        parser.add_argument(
            "--secrets-stdin",
            action="store_true",
            help="read more --header lines (a URL's server) or --env lines (--command) from stdin, one per "
            "line: credentials kept out of the command line and the shell's history",
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
        if options.get("secrets_stdin"):
            lines = _secret_lines(options.get("stdin") or sys.stdin)
            if options.get("command"):
                options["env"] = [*options.get("env", []), *lines]
            else:
                header = [*header, *lines]
        if not McpServer.objects.filter(slug=slug).exists():  # one registered before the rule keeps its slug
            _check(McpServer, "slug", slug, f"the slug {slug[:60]!r}")
            try:
                validate_server_slug(slug)
            except ValidationError as exc:
                raise CommandError(f"{slug!r}: {' '.join(exc.messages)}") from None
        _check(McpServer, "name", name or "-", "--name")
        if team and not Team.objects.filter(slug=team).exists():
            _check(Team, "slug", team, f"--team {team[:60]!r}")
            if TeamSlug.objects.filter(slug=team).exists():
                raise CommandError(
                    f"--team {team[:60]!r}: a team that no longer exists had that slug, and a slug names one "
                    "team for good; choose another"
                )
        if options.get("command"):
            if url or header:
                raise CommandError("a stdio server (--command) has no URL and no --header")
            return self.add_stdio(slug, name, team, era, options)
        if options.get("arg") or options.get("env") or options.get("clear_env"):
            raise CommandError("--arg, --env and --clear-env belong to a stdio server (--command)")
        if not url:
            raise CommandError("give the server's URL, or --command for a server the hub runs (stdio)")
        try:
            URLValidator(schemes=["http", "https"])(url)
        except ValidationError:
            raise CommandError(f"{urlsafety.shown(url)[:100]!r} is not an http(s) URL.") from None
        _check(McpServer, "url", url, "the URL")
        try:
            netguard.check_url(url)
        except netguard.Refused as exc:
            raise CommandError(
                f"the server URL is refused: {exc.message} (ELICIT_OUTBOUND_ALLOW lists exceptions)"
            ) from None
        try:
            headers = parse_header_lines(header)
        except ValueError as exc:  # never names a value: it is a credential
            raise CommandError(f"--header: {exc}") from None
        clear = bool(options.get("clear_headers"))
        if headers and clear:
            raise CommandError("--header sets the headers, --clear-headers removes them: give one")
        row = McpServer.objects.filter(slug=slug).values_list("transport", "url", "headers").first()
        stored = row[:2] if row else None
        if row and row[2] and not headers and not clear:
            _check_credentials_follow(row[1], url)
        # Moved to another address: what the hub learned at the old one (era, tools) does not stand.
        moved = dict.fromkeys(LEARNED) if stored not in (None, (McpServer.Transport.HTTP, url)) else {}
        given = {"headers": headers} if headers or clear else {}  # else the stored ones stay
        server, verb = self.register(slug, name, team, era, {**NOT_STDIO, "url": url, **given, **moved})
        self.stdout.write(
            f"{verb} MCP server {server.slug} at {shown(urlsafety.shown(server.url))}"
            + (f" ({len(headers)} header(s))" if headers else "")
            + f", era {server.era}"
        )
        if no_probe:
            return
        found = server_probe(server)
        self.stdout.write(f"probe: {shown(probe_summary(found))}")
        if not found["ok"]:
            error = found.get("error") or {}
            self.stdout.write(f"error: {shown(error.get('code'))}: {shown(error.get('message'))}")
            if found.get("hint"):
                self.stdout.write(f"hint: {shown(found['hint'])}")
            self.stdout.write(
                "the server is registered all the same; `manage.py check_server` probes it again"
            )

    def register(
        self, slug: str, name: str, team: str, era: str | None, fields: dict[str, Any]
    ) -> tuple[McpServer, str]:
        """Create or update the server with `fields`, its name, default team and era: (server, verb). Audited,
        with the team it creates (secrets only as set, changed or cleared). On a server already registered, a
        name, team or era not given stays as stored: re-registering it for a new credential must not send its
        requests to no team (any staff member's). A new server is named after its slug, of no team."""
        with transaction.atomic():
            given: dict[str, Any] = {"name": name} if name else {}
            if team:
                given["default_team"], _ = config_audit.get_or_create(
                    Team, actor=ACTOR, slug=team, defaults={"name": team.replace("-", " ").title()}
                )
            if era:
                given["era"] = era
            server, created = config_audit.update_or_create(
                McpServer,
                actor=ACTOR,
                slug=slug,
                defaults={**fields, **given},
                create_defaults={"name": slug.replace("-", " ").title(), **fields, **given},
            )
        return server, "registered" if created else "updated"

    def add_stdio(self, slug: str, name: str, team: str, era: str | None, options: dict[str, Any]) -> None:
        """A stdio server: the command (checked now, run by a holder), its arguments and environment."""
        try:
            command = stdio_rules.check_command(options["command"])
            args = stdio_rules.check_args(options["arg"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            env = stdio_rules.parse_env_lines(options["env"])
        except ValueError as exc:
            raise CommandError(f"--env: {exc}") from None
        clear = bool(options.get("clear_env"))
        if env and clear:
            raise CommandError("--env sets the environment, --clear-env removes it: give one")
        if not env and not clear:
            _check_environment_follows(slug, command, args)
        stdio = {"transport": McpServer.Transport.STDIO, "url": "", "headers": {}, "command": command}
        given = {"env": env} if env or clear else {}  # else the stored one stays
        server, verb = self.register(slug, name, team, era, {**stdio, "args": args, **given})
        self.stdout.write(
            f"{verb} stdio MCP server {server.slug}: {command} with {len(args)} argument(s)"
            + (f" and {len(env)} environment variable(s)" if env else "")
            + f", era {server.era}"
        )
        # Started (and probed) by the holder that takes its lease; it is never started twice to probe it.
        self.stdout.write("the holder starts it and probes it; `manage.py check_server` shows the probe")


def _secret_lines(stream: Any) -> list[str]:
    """The non-blank lines of `stream` (at most SECRETS_MAX bytes), their line ends removed; never shown."""
    text = stream.read(SECRETS_MAX + 1)
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if len(text.encode()) > SECRETS_MAX:
        raise CommandError(f"--secrets-stdin: more than {SECRETS_MAX // 1024} KiB on stdin")
    return [line.rstrip("\r") for line in text.split("\n") if line.strip()]


def _check_credentials_follow(stored: str, url: str) -> None:
    """Stored headers (credentials, never shown) do not follow a server to another origin unseen, as in the
    admin: a mistyped or re-used slug would otherwise send them to whoever answers at the new address."""
    before, after = urlsafety.request_origin(stored), urlsafety.request_origin(url)
    if before != after:
        raise CommandError(
            f"the stored headers were set for {shown(urlsafety.origin(stored))}; to send requests to "
            f"{shown(urlsafety.origin(url))}, give them again with --header, or remove them "
            "with --clear-headers"
        )


def _check_environment_follows(slug: str, command: str, args: list[str]) -> None:
    """A stored environment (secrets, never shown) does not follow a stdio server to another command or other
    arguments unseen, as in the admin: they could run a program that reads it."""
    row = McpServer.objects.filter(slug=slug, transport=McpServer.Transport.STDIO).values_list(
        "command", "args", "env"
    )
    for stored_command, stored_args, env in row:
        if env and (stored_command, list(stored_args or [])) != (command, args):
            raise CommandError(
                "the stored environment was set for the server's command and arguments as they were; to "
                "run these, give it again with --env, or remove it with --clear-env"
            )


def _check(model: type[Model], field: str, value: str, what: str) -> None:
    """A CommandError saying what is wrong unless `value` suits the model's `field` (its length, a slug's
    characters): refused here, not by the database after a traceback."""
    checked = model._meta.get_field(field)
    assert isinstance(checked, Field)
    try:
        checked.clean(value, None)
    except ValidationError as exc:
        raise CommandError(f"{what}: {' '.join(exc.messages)}") from None
