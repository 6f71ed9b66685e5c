"""MCP servers as the hub knows them: the tool list it caches (annotations feed routing and the UI)."""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.utils import timezone

from approvals import mcp_client
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import McpServer


def parse_header_lines(lines: Iterable[str]) -> dict[str, str]:
    """Headers sent to a server, from "Name: value" lines (blank lines skipped).

    Raises ValueError naming the part before the first colon of a bad line, never its value.
    """
    headers = {}
    for line in filter(None, (line.strip() for line in lines)):
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise ValueError(key)
        headers[key.strip()] = value.strip()
    return headers


def server_config(server: McpServer) -> mcp_client.ServerConfig:
    """How the MCP client reaches the server: its URL, its headers (credentials included), time limits."""
    return mcp_client.ServerConfig(
        url=server.url,
        headers=dict(server.headers or {}),
        discover=server.discover,
        timeout=float(settings.ELICIT_MCP_TIMEOUT),
    )


def server_refresh_tools(*, server: McpServer) -> list[dict]:
    """Fetch tools/list (every page; tools with invalid x-mcp-header annotations dropped) and cache it."""
    tools = mcp_client.run(mcp_client.list_tools(server_config(server)))
    McpServer.objects.filter(pk=server.pk).update(tools=tools, tools_fetched_at=timezone.now())
    server.tools = tools
    audit.record(
        actor=Actor.system(),
        verb="server.tools_refreshed",
        data={"server": server.slug, "tools": [tool.get("name") for tool in tools]},
    )
    return tools
