"""MCP servers as the hub knows them: the era they speak (the last probe) and the tool list it caches
(annotations feed routing and the UI)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals import broadcast, mcp_client
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.mcp_client import probe as mcp_probe
from approvals.mcp_client import toollist
from approvals.mcp_client.wire import quoted
from approvals.models import McpServer

logger = logging.getLogger(__name__)
RETRY_UNREACHABLE = 300  # seconds
NOT_RUNNING = "not_running"  # a stdio server asked of a process other than the holder running it


MAX_HEADERS = 50
MAX_HEADER_VALUE = 8192  # characters
# RFC 9110: a header's name is a token; its value visible ASCII, spaces and tabs (what HTTP/1.1 can carry).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
# Headers the HTTP client or the MCP transport writes for each request: where it goes (Host: another virtual
# host at an address the outbound guard let through for this URL's), how its body is framed, what it says
# in MCP's own words, and the one idempotency key of a send (a constant one would make a server that
# honours it answer every call with the first call's result). A stored one would override or contradict them.
RESERVED_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "expect",
        "host",
        "idempotency-key",
        "keep-alive",
        "last-event-id",
        "mcp-method",
        "mcp-name",
        "mcp-protocol-version",
        "mcp-session-id",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
RESERVED_PREFIXES = ("mcp-param-",)


def reserved_header(name: str) -> bool:
    """Whether the hub sets header `name` itself on each request to a server (`RESERVED_HEADERS`)."""
    lowered = name.lower()
    return lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_PREFIXES)


def parse_header_lines(lines: Iterable[str]) -> dict[str, str]:
    """Headers sent to a server, from "Name: value" lines (blank lines skipped).

    Raises ValueError saying what is wrong with a line: its value, and a name that is no header name, are
    never in the message (a value is a credential, and a line without a colon may be one pasted alone).
    """
    headers: dict[str, str] = {}
    for line in filter(None, (line.strip() for line in lines)):
        key, sep, value = line.partition(":")
        name, value = key.strip(), value.strip()
        if not sep or not name:
            raise ValueError('each line must look like "Name: value"')
        if not _HEADER_NAME.fullmatch(name):
            raise ValueError(
                'each line must look like "Name: value", and a header name holds only letters, digits and '
                "!#$%&'*+-.^_`|~ (at most 100)"
            )
        if reserved_header(name):
            raise ValueError(
                f"the {name} header is set by the hub itself on each request (how it is sent, or what MCP "
                "says in it): leave it out"
            )
        if not _HEADER_VALUE.fullmatch(value):
            raise ValueError(
                f"the value of the {name} header may hold only printable ASCII characters (no accents, no "
                "line breaks or other control characters)"
            )
        if len(value) > MAX_HEADER_VALUE:
            raise ValueError(f"the value of the {name} header is longer than {MAX_HEADER_VALUE} characters")
        if name.lower() in (known.lower() for known in headers):
            raise ValueError(f"the {name} header is given twice")
        headers[name] = value
        if len(headers) > MAX_HEADERS:
            raise ValueError(f"a server takes at most {MAX_HEADERS} headers")
    return headers


# What the hub learned of a server at its address: its last probe, server/discover result and tool list.
LEARNED = ("probe", "probed_at", "discover", "tools", "tools_fetched_at")


def server_moved(server: McpServer) -> None:
    """`LEARNED` emptied on `server` (saved by the caller): it now answers at another address, whose era
    and tools may not be those of the old one (routing, grants and approvals read the stored tool
    definitions), so nothing learned there stands until the new address is probed."""
    for name in LEARNED:
        setattr(server, name, None)


def _sent_headers(server: McpServer) -> dict[str, str]:
    """The server's stored headers but those the hub sets itself (`RESERVED_HEADERS`): a row saved before
    they were refused must not route or frame the hub's requests either. Their names are logged, never
    their values."""
    headers = dict(server.headers or {})
    left_out = sorted(name for name in headers if reserved_header(str(name)))
    if left_out:
        logger.warning("server %s: stored headers not sent (the hub sets them): %s", server.slug, left_out)
    return {name: value for name, value in headers.items() if name not in left_out}


def server_config(server: McpServer) -> mcp_client.ServerConfig:
    """How the MCP client reaches the server: its URL, its headers (credentials included), time limits."""
    return mcp_client.ServerConfig(
        url=server.url,
        headers=_sent_headers(server),
        discover=server.discover,
        timeout=float(settings.ELICIT_MCP_TIMEOUT),
    )


def _at_its_address(server: McpServer) -> Any:
    """The server's row while it is still registered at the address `server` was read with. What was
    learned there (a probe, a tool list: slow reads of a server that may hang) is stored only on that row:
    an admin may have moved the server meanwhile (`server_moved`), and the old address's era and tools would
    pass for the new one's until the next probe."""
    return McpServer.objects.filter(pk=server.pk, url=server.url, transport=server.transport)


def _moved_meanwhile(server: McpServer, what: str) -> None:
    logger.info("server %s moved while its %s was read; the old address's is not stored", server.slug, what)


MAX_NAMES_SHOWN = 5  # of the names listed twice, in a log line or the probe's one-line summary


def _names_shown(names: Any) -> str:
    """The first of `names` (a server's own text) quoted, control characters escaped: for a log line."""
    names = names if isinstance(names, list) else []
    shown = ", ".join(quoted(name) for name in names[:MAX_NAMES_SHOWN])
    return shown + (", ..." if len(names) > MAX_NAMES_SHOWN else "")


def _warn_duplicates(server: McpServer, tools: Any) -> None:
    if dropped := toollist.duplicates(tools):
        logger.warning(
            "server %s lists %d tool(s) under a name listed before (%s): the first of each name is kept",
            server.slug,
            dropped,
            _names_shown(tools.duplicated),
        )


def _store_tools(server: McpServer, tools: list[dict[str, Any]], *, why: str | None = None) -> list[dict]:
    """Store a tool list read from the server and audit it (``server.tools_refreshed``).

    The list goes under the one rule every listing follows (`toollist`: a bounded number of storable tools,
    marked when the server listed more); one listed under it already is stored as it is. The audit event
    names a bounded number of them, so neither the JSONB write nor the event grows with what a server sends.
    Nothing is stored when the server moved while the list was read (`_at_its_address`).
    """
    kept = toollist.bounded(tools)
    if kept.truncated:
        logger.warning("server %s lists more tools than the hub keeps: kept %d", server.slug, len(kept))
    _warn_duplicates(server, kept)
    now = timezone.now()
    if not _at_its_address(server).update(tools=kept, tools_fetched_at=now):
        _moved_meanwhile(server, "tool list")
        return kept
    transaction.on_commit(broadcast.tools_changed)  # the gateway's clients may see other tools
    server.tools = kept
    server.tools_fetched_at = now
    data = {"server": server.slug, **kept.summary()}
    audit.record(
        actor=Actor.system(), verb="server.tools_refreshed", data=data | ({"why": why} if why else {})
    )
    return kept


def server_probe_run(server: McpServer) -> mcp_probe.ProbeResult | None:
    """Probe an HTTP server as configured in memory (its URL, headers and era, saved or not) through the
    outbound guard, storing nothing: the admin probes a server before its transaction writes anything, so
    no lock is held while a slow server answers. None for a stdio server (its holder probes it)."""
    if server.transport != McpServer.Transport.HTTP:
        return None
    return mcp_client.run(mcp_probe.probe(server_config(server), era=server.era))


def server_probe(
    server: McpServer,
    *,
    target: mcp_probe.Target | None = None,
    result: mcp_probe.ProbeResult | None = None,
    actor: Actor | None = None,
) -> dict[str, Any]:
    """Probe the server for its era, identity, capabilities, tools and latency, and store what was found.

    Never fails for a server that cannot be reached or understood: the probe JSON then says ``ok: false``
    with the error and a hint, and the stored tool list is kept. HTTP servers are reached through the
    outbound guard. A stdio server runs in exactly one process, so the process running it passes the
    `result` of `probe.probe_open` on its session (or a `target` transport factory); without either the
    stored probe is returned as it is.
    """
    if result is None:
        if target is None and server.transport == McpServer.Transport.HTTP:
            target = server_config(server)
        if target is None:
            return server.probe or {
                "ok": False,
                "era": None,
                "error": {"code": NOT_RUNNING, "message": "the process that runs this server probes it"},
                "hint": "start the holder; it probes a stdio server when it starts it",
            }
        result = mcp_client.run(mcp_probe.probe(target, era=server.era))
    found = result.as_json()  # with ``tools_duplicated``: the later definitions of a name listed again
    _warn_duplicates(server, result.tools)
    now = timezone.now()
    update: dict[str, Any] = {"probe": found, "probed_at": now}
    if result.era == mcp_probe.MODERN and result.discover is not None:
        update["discover"] = result.discover
    elif result.era == mcp_probe.HANDSHAKE:
        update["discover"] = None
    if result.tools is not None:
        update["tools"] = result.tools
        update["tools_fetched_at"] = now
    if not _at_its_address(server).update(**update):
        _moved_meanwhile(server, "probe")
        return found
    if result.tools is not None:
        transaction.on_commit(broadcast.tools_changed)
    for name, value in update.items():
        setattr(server, name, value)
    audit.record(
        actor=actor or Actor.system(),
        verb="server.probed",
        data={
            "server": server.slug,
            "ok": result.ok,
            "era": result.era,
            "protocol_version": result.protocol_version,
            "tool_count": result.tool_count,
            "tools_truncated": result.tools_truncated,
            "tools_duplicated": found.get("tools_duplicated", 0),
            "latency_ms": result.latency_ms,
            "error": result.error,
        },
    )
    return found


def server_refresh_tools(*, server: McpServer) -> list[dict]:
    """Fetch tools/list (its pages, as many tools as the hub keeps; tools with invalid x-mcp-header
    annotations or that cannot be stored dropped) and cache it.

    A handshake-era server is probed instead, which lists its tools on a session. Raises `McpError` when
    nothing was listed (the stored list is kept): the server could not be reached or listed, or it is a
    stdio server, whose tools only the holder running it lists, on its own session (at its start, and
    when the server says they changed: `server_tools_changed` with the list).
    """
    if server.transport == McpServer.Transport.STDIO:
        raise mcp_client.PermanentError(
            NOT_RUNNING, "a stdio server's tools are listed by the holder running it"
        )
    if server.needs_session:
        result = mcp_client.run(mcp_probe.probe(server_config(server), era=server.era))
        server_probe(server, result=result)
        if result.tools is None:
            error = result.error or {}
            kind = mcp_client.TransientError if not result.reachable else mcp_client.PermanentError
            raise kind(error.get("code") or "unexpected_error", error.get("message") or "nothing was listed")
        return list(server.tools or [])
    return _store_tools(server, mcp_client.run(mcp_client.list_tools(server_config(server))))


def server_tools_changed(
    server_id: Any, *, tools: list[dict[str, Any]] | None = None, url: str | None = None
) -> list[dict] | None:
    """The server said its tool list changed (``notifications/tools/list_changed``): store the new list.

    A process holding a session with the server may pass the `tools` it listed on that session (a stdio
    server must not be started twice to list them, so only its holder can), and the `url` the session is
    at; otherwise the hub lists them again itself. Returns the stored list, or None when the server is gone,
    was moved from `url` since the session opened (the list is the old address's), could not be reached or
    listed, or is a stdio server and no list was passed (the old list is kept).
    """
    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        return None
    if url is not None and server.url != url:
        _moved_meanwhile(server, "tool list")
        return None
    if tools is not None:
        return _store_tools(server, tools, why="list_changed")
    try:
        return server_refresh_tools(server=server)
    except mcp_client.McpError as exc:
        logger.warning("server %s: could not list its tools again: %s", server.slug, exc.code)
        return None


def server_refresh_if_stale(server: McpServer, *, max_age: float) -> bool:
    """Re-list the server's tools unless they were fetched in the last `max_age` seconds (several workers
    meeting the same unknown tool list it once). True when a refresh ran and succeeded; False also for a
    stdio server, whose tools only the holder running it lists (on its session: nothing to do here)."""
    if server.transport == McpServer.Transport.STDIO:
        return False
    fresh = server.tools_fetched_at is not None and server.tools_fetched_at > timezone.now() - timedelta(
        seconds=max_age
    )
    if fresh:
        return False
    try:
        server_refresh_tools(server=server)
    except mcp_client.McpError as exc:
        logger.warning("server %s: could not list its tools again: %s", server.slug, exc.code)
        return False
    return True


def servers_refresh_stale(*, now: Any = None) -> int:
    """Beat: probe every enabled HTTP server whose tool list is older than ELICIT_TOOLS_REFRESH_INTERVAL
    (this re-lists its tools and notices a change of era). Returns how many were probed."""
    now = now or timezone.now()
    interval = settings.ELICIT_TOOLS_REFRESH_INTERVAL
    cutoff = now - timedelta(seconds=interval)
    # A server that could not be reached is tried again after a few minutes, not at every tick.
    retry = now - timedelta(seconds=min(interval, RETRY_UNREACHABLE))
    due = (
        McpServer.objects.filter(enabled=True, transport=McpServer.Transport.HTTP)
        .filter(Q(tools_fetched_at__isnull=True) | Q(tools_fetched_at__lt=cutoff))
        .filter(Q(probed_at__isnull=True) | Q(probed_at__lt=retry))
    )
    count = 0
    for server in due.order_by("tools_fetched_at")[: settings.ELICIT_TOOLS_REFRESH_BATCH]:
        server_probe(server)
        count += 1
    return count


UNKNOWN_TOOL_RELIST_AFTER = 30  # seconds: a stored list this fresh is not fetched again for an unknown tool


def _result_names_unknown_tool(result: dict[str, Any]) -> bool:
    texts = [item.get("text") for item in result.get("content") or [] if isinstance(item, dict)]
    return any(isinstance(text, str) and mcp_client.names_unknown_tool(text) for text in texts)


def server_after_send(
    server: McpServer,
    tool: str,
    *,
    outcome: mcp_client.Outcome | None = None,
    error: mcp_client.McpError | None = None,
) -> None:
    """What a 2026-07-28 send taught the hub about the server, acted on at once.

    - It refused the stateless request as a handshake-era server would (``protocol_unsupported``) and its
      era is ``auto``: probe it again, so the next call goes to a session if it speaks the handshake era.
    - It does not know the tool, its ``Mcp-Param-*`` headers did not match, or it answered for a tool the
      stored list lacks: list its tools again (routing rules read their annotations from that list).
    """
    if error is not None:
        if error.code == "protocol_unsupported":
            if server.era == McpServer.Era.AUTO and server.transport == McpServer.Transport.HTTP:
                server_probe(server)
        elif error.code in ("unknown_tool", "header_mismatch"):
            server_refresh_if_stale(server, max_age=UNKNOWN_TOOL_RELIST_AFTER)
        return
    unknown = isinstance(outcome, mcp_client.ToolError) and _result_names_unknown_tool(outcome.result)
    if unknown or server.tool(tool) is None:
        server_refresh_if_stale(server, max_age=UNKNOWN_TOOL_RELIST_AFTER)


def probe_summary(found: dict[str, Any] | None) -> str:
    """One line for people: what the last probe found (the admin list, add_server, check_server)."""
    if not found:
        return "not probed yet"
    parts = []
    if found.get("era"):
        version = found.get("protocol_version")
        parts.append(f"era {found['era']}" + (f" ({version})" if version and version != found["era"] else ""))
    info = found.get("server_info") or {}
    if info.get("name"):
        parts.append(f"server {info['name']} {info.get('version') or ''}".rstrip())
    if found.get("tool_count") is not None:
        kept = " (the first ones: the server lists more)" if found.get("tools_truncated") else ""
        if found.get("tools_duplicated"):
            names = _names_shown(found.get("tools_duplicated_names"))
            kept += f" ({found['tools_duplicated']} listed twice, dropped: the first of each name is kept" + (
                f": {names})" if names else ")"
            )
        parts.append(f"{found['tool_count']} tool(s){kept}")
    if found.get("latency_ms") is not None:
        parts.append(f"{found['latency_ms']} ms")
    state = "ok" if found.get("ok") else ("unreachable" if probe_unreachable(found) else "NOT USABLE")
    return f"{state}: " + ", ".join(parts) if parts else state


def probe_unreachable(found: dict[str, Any] | None) -> bool:
    """The last probe could not reach the server at all (no era found, a connection-level error)."""
    if not found or found.get("ok") or found.get("era"):
        return False
    return (found.get("error") or {}).get("code") in {*mcp_probe.UNREACHABLE, NOT_RUNNING}
