from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from approvals import urlsafety
from approvals.management.commands._cli import ENGINE_DOWN, HubCommand, shown
from approvals.models import McpServer
from approvals.services.servers import probe_summary, probe_unreachable, server_probe

UNREACHABLE = 1
NOT_USABLE = 2
# The check did not run: no server by that slug, or an engine down (every command's ENGINE_DOWN).
NOT_PROBED = ENGINE_DOWN


class Command(HubCommand):
    help = (
        "Probe a registered MCP server (era, version, capabilities, tools, latency), store what was found "
        f"and print it. Exits {UNREACHABLE} when the server is unreachable, {NOT_USABLE} when it answers but "
        f"cannot be used as configured (another era, refused credentials), {NOT_PROBED} when it was not "
        "probed (no server by that slug, or the hub's database is unavailable)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("slug")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the probe as JSON")

    def handle(self, *args: Any, slug: str, as_json: bool, **options: Any) -> None:
        server = McpServer.objects.filter(slug=slug).first()
        if server is None:
            # Not 1: a script reads 1 as "the server is unreachable", which a mistyped slug says nothing of.
            raise CommandError(f"unknown server {shown(slug)[:100]!r}", returncode=NOT_PROBED)
        found = server_probe(server)
        if as_json:
            self.stdout.write(json.dumps(found, indent=2, sort_keys=True))
        else:
            self._show(server, found)
        if found["ok"]:
            return
        if probe_unreachable(found):
            raise CommandError(f"{slug} is unreachable", returncode=UNREACHABLE)
        raise CommandError(f"{slug} cannot be used as configured", returncode=NOT_USABLE)

    def _show(self, server: McpServer, found: dict[str, Any]) -> None:
        target = urlsafety.shown(server.url) or server.command
        self.stdout.write(shown(f"{server.slug} ({server.transport} {target}), era setting {server.era}"))
        self.stdout.write(f"probe: {shown(probe_summary(found))}")
        info = found.get("server_info") or {}
        rows = [
            ("era", found.get("era") or "unknown"),
            ("protocol version", found.get("protocol_version") or "unknown"),
            ("server", f"{info.get('name', '?')} {info.get('version', '')}".strip() if info else "unknown"),
            ("capabilities", ", ".join(sorted(found.get("capabilities") or {})) or "none"),
            ("tools", found.get("tool_count") if found.get("tool_count") is not None else "unknown"),
            ("latency", f"{found['latency_ms']} ms" if found.get("latency_ms") is not None else "unknown"),
            ("probed at", found.get("probed_at")),
        ]
        error = found.get("error")
        if error:
            rows.append(("error", f"{error.get('code')}: {error.get('message')}"))
        if found.get("hint"):
            rows.append(("hint", found["hint"]))
        width = max(len(label) for label, _ in rows)
        for label, value in rows:
            self.stdout.write(f"  {label.ljust(width)}  {shown(value)}")
        if server.tools:
            names = ", ".join(shown(tool.get("name")) for tool in server.tools[:50])
            more = f" and {len(server.tools) - 50} more" if len(server.tools) > 50 else ""
            self.stdout.write(f"  {'tool names'.ljust(width)}  {names}{more}")
