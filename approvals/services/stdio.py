"""stdio servers: the PostgreSQL lease that lets exactly one holder process run each, and what it runs.

A stdio server is a command the hub starts. Two holders running the same one would be two servers with two
states (and a tool run twice), so each holder takes the lease (`McpServer.stdio_holder`) before it starts
the process: only when the lease is free, already its own, or held by a holder whose heartbeat is older
than `ELICIT_HOLDER_STALE` seconds (that holder is presumed dead; its server process died with it, and its
calls on the server are ended then, as beat's sweep would end them).
The holder's heartbeat renews the lease; the holder releases it when it stops.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import broadcast
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.mcp_client import toollist
from approvals.mcp_client.wire import quoted
from approvals.models import Holder, McpServer
from approvals.services import holding

logger = logging.getLogger(__name__)

# Limits on what an admin registers (the command line and environment of a process the hub starts).
MAX_COMMAND = 500
MAX_ARGS = 64
MAX_ARG = 4096
MAX_ENV = 64
MAX_ENV_VALUE = 8192
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Launch:
    """What a holder starts for one stdio server (read fresh at every start, so edits apply on restart)."""

    slug: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    era: str = McpServer.Era.AUTO
    timeout: float = 30.0

    def __repr__(self) -> str:  # the environment may hold credentials
        return f"<Launch {self.slug} {self.command} ({len(self.args)} args, {len(self.env)} env)>"


def check_command(command: str) -> str:
    """The absolute path of `command` (an absolute path, or a name found on PATH); ValueError otherwise."""
    command = command.strip()
    if not command:
        raise ValueError("The command is empty.")
    if len(command) > MAX_COMMAND or "\x00" in command:
        raise ValueError(f"The command is longer than {MAX_COMMAND} characters.")
    if "/" in command:
        path = Path(command)
        if not path.is_absolute():
            raise ValueError("The command must be an absolute path or a name found on PATH.")
        if not path.is_file() or not shutil.which(str(path)):
            raise ValueError(f"{command} is not an executable file.")
        return str(path)
    found = shutil.which(command)
    if not found:
        raise ValueError(f"{command!r} is not found on PATH; give its absolute path.")
    return found


def check_args(args: Iterable[str]) -> list[str]:
    args = list(args)
    if len(args) > MAX_ARGS:
        raise ValueError(f"At most {MAX_ARGS} arguments.")
    for arg in args:
        if not isinstance(arg, str) or len(arg) > MAX_ARG or "\x00" in arg:
            raise ValueError(f"Each argument is text of at most {MAX_ARG} characters.")
    return args


def parse_env_lines(lines: Iterable[str]) -> dict[str, str]:
    """A stdio server's environment, from "NAME=value" lines (blank lines skipped).

    Raises ValueError naming the line's position and, if valid, its name; never its value.
    """
    env: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        line = line.strip("\r\n")
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not ENV_NAME.fullmatch(name):
            raise ValueError(f'line {number} is not "NAME=value" (a name of letters, digits and _)')
        if len(value) > MAX_ENV_VALUE or "\x00" in value:
            raise ValueError(f"the value of {name} is longer than {MAX_ENV_VALUE} characters")
        env[name] = value
    if len(env) > MAX_ENV:
        raise ValueError(f"at most {MAX_ENV} variables")
    return env


def stdio_launch(*, server_id: int) -> Launch:
    server = McpServer.objects.get(pk=server_id)
    if server.transport != McpServer.Transport.STDIO:
        raise ValueError(f"{server.slug} is not a stdio server")
    return Launch(
        slug=server.slug,
        command=server.command,
        args=[str(arg) for arg in server.args or []],
        env={str(key): str(value) for key, value in (server.env or {}).items()},
        era=server.era,
        timeout=float(settings.ELICIT_MCP_TIMEOUT),
    )


def _stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.ELICIT_HOLDER_STALE)


def stdio_lease_take(*, server_id: int, holder_name: str) -> bool:
    """Take the lease on a stdio server for this holder: True if it now holds it (or already did).

    One taken over from a holder whose heartbeat is stale ends that holder's calls on the server, as the sweep
    that declares the holder lost would (`holding.holder_calls_lost`): its process (and the server it ran) is
    presumed dead, and those calls would otherwise stay open, held by it, until beat's sweep ran."""
    with transaction.atomic():
        server = (
            McpServer.objects.select_for_update(of=("self",), no_key=True)
            .select_related("stdio_holder")
            .filter(pk=server_id, transport=McpServer.Transport.STDIO, enabled=True)
            .first()
        )
        holder = Holder.objects.filter(name=holder_name).first()
        if server is None or holder is None:
            return False
        current = server.stdio_holder
        if current is not None and current.pk == holder.pk:
            return True
        if current is not None and current.heartbeat_at >= _stale_before():
            return False
        McpServer.objects.filter(pk=server.pk).update(stdio_holder=holder)
        audit.record(
            actor=Actor.system(),
            verb="server.stdio_leased",
            data={
                "server": server.slug,
                "holder": holder.name,
                **({"taken_from": current.name} if current is not None else {}),
            },
        )
    if current is not None:
        # Its process (and the server it ran) is presumed dead: its calls on the server end as the sweep that
        # declares it lost would end them, not held by it until the sweep runs.
        holding.holder_calls_lost(
            holder_id=current.pk,
            why=f"its holder process {current.name} stopped answering",
            server_id=server_id,
        )
    return True


def stdio_lease_held(*, server_id: int, holder_name: str) -> bool:
    """Whether this holder still holds the lease (another takes it over once this holder's heartbeat is
    stale, and an admin may disable the server or make it an HTTP one)."""
    return McpServer.objects.filter(
        pk=server_id, stdio_holder__name=holder_name, transport=McpServer.Transport.STDIO, enabled=True
    ).exists()


def stdio_lease_release(*, server_id: int, holder_name: str) -> None:
    holder = Holder.objects.filter(name=holder_name).first()
    if holder is not None:
        McpServer.objects.filter(pk=server_id, stdio_holder=holder).update(stdio_holder=None)


def stdio_restarted(*, server_id: int, holder_name: str, reason: str, restarts: int) -> None:
    """Audit a stdio server's restart after its process ended (a crash, or an exit of its own)."""
    slug = McpServer.objects.filter(pk=server_id).values_list("slug", flat=True).first() or ""
    audit.record(
        actor=Actor.system(),
        verb="server.stdio_restarted",
        data={"server": slug, "holder": holder_name, "reason": reason[:200], "restarts": restarts},
    )


def stdio_probed(*, server_id: int, found: dict[str, Any], tools: list[dict[str, Any]] | None) -> None:
    """Store what a holder read on a stdio server's new session: the probe JSON (`probe.ProbeResult`), and its
    tools if listed, under the one rule every listing follows (`toollist`), as an HTTP server's probe is
    (`servers.server_probe`): the first definition of a name listed again is the one kept, and the probe JSON
    and its audit event say how many were dropped (``tools_duplicated``) and whether the list was cut."""
    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        return
    now = timezone.now()
    found = {**found, "probed_at": now.isoformat()}
    update: dict[str, Any] = {"probe": found, "probed_at": now}
    if tools is not None:
        kept = toollist.bounded(tools)
        if kept.duplicates and not found.get("tools_duplicated"):  # a list the probe did not read
            found |= {"tools_duplicated": kept.duplicates, "tools_duplicated_names": list(kept.duplicated)}
        if kept.truncated:
            found["tools_truncated"] = True
        found["tool_count"] = len(kept)
        if found.get("tools_duplicated"):
            names = found.get("tools_duplicated_names") or []
            logger.warning(
                "server %s lists %d tool(s) under a name listed before (%s): the first of each name is kept",
                server.slug,
                found["tools_duplicated"],
                ", ".join(quoted(name) for name in names[:5]) + (", ..." if len(names) > 5 else ""),
            )
        update |= {"tools": kept, "tools_fetched_at": now}
        transaction.on_commit(broadcast.tools_changed)  # the gateway's clients may see other tools
    McpServer.objects.filter(pk=server_id).update(**update)
    audit.record(
        actor=Actor.system(),
        verb="server.probed",
        data={
            "server": server.slug,
            "ok": found.get("ok"),
            "era": found.get("era"),
            "protocol_version": found.get("protocol_version"),
            "tool_count": found.get("tool_count"),
            "tools_truncated": bool(found.get("tools_truncated")),
            "tools_duplicated": found.get("tools_duplicated", 0),
            "latency_ms": found.get("latency_ms"),
            "error": found.get("error"),
        },
    )


def stdio_start_failed(*, server_id: int, message: str) -> None:
    """A stdio server did not start (the command failed, exited, or did not answer): the probe says so.
    Audited once when it stops working, not at every retry."""
    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        return
    now = timezone.now()
    was_ok = (server.probe or {}).get("ok", True)
    error = {"code": "not_running", "message": message[:500]}
    found = {
        "ok": False,
        "era": None,
        "protocol_version": None,
        "server_info": None,
        "capabilities": {},
        "tool_count": None,
        "latency_ms": None,
        "error": error,
        "hint": "the command fails at start: its stderr is in the hub's log "
        f"(logger approvals.stdio.{server.slug})",
        "probed_at": now.isoformat(),
    }
    McpServer.objects.filter(pk=server_id).update(probe=found, probed_at=now)
    if was_ok:
        audit.record(
            actor=Actor.system(),
            verb="server.probed",
            data={"server": server.slug, "ok": False, "era": None, "error": error},
        )
