"""What a slow read of a server found is stored only while the server still answers at the address read: an
admin who moves it meanwhile must not get the old address's era and tools under the new one (on the real
PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from approvals.mcp_client import probe as mcp_probe
from approvals.models import AuditEvent, McpServer
from approvals.services import servers
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

OLD_TOOLS = [{"name": "wipe", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]


def _found(tools: list[dict[str, Any]]) -> mcp_probe.ProbeResult:
    return mcp_probe.ProbeResult(
        ok=True,
        era=mcp_probe.HANDSHAKE,
        protocol_version="2025-06-18",
        server_info={"name": "old", "version": "1"},
        capabilities={},
        tool_count=len(tools),
        latency_ms=5,
        error=None,
        hint=None,
        probed_at=timezone.now().isoformat(),
        tools=tools,
    )


def _move(server: McpServer) -> None:
    """The admin gives the server a new address (its learned facts emptied, as the admin form does)."""
    moved = McpServer.objects.get(pk=server.pk)
    moved.url = "http://127.0.0.1:10/mcp"
    servers.server_moved(moved)
    moved.save()


def test_a_probe_of_the_old_address_that_ends_after_the_server_moved_is_not_stored() -> None:
    server = factories.server("slow", url="http://127.0.0.1:9/mcp")
    read = McpServer.objects.get(pk=server.pk)  # as beat read it before probing
    _move(server)

    found = servers.server_probe(read, result=_found(OLD_TOOLS))

    assert found["ok"] is True  # what the probe found is still returned to its caller
    stored = McpServer.objects.get(pk=server.pk)
    assert stored.url == "http://127.0.0.1:10/mcp"
    assert stored.probe is None and stored.tools is None and stored.tools_fetched_at is None
    assert not AuditEvent.objects.filter(verb="server.probed").exists()


def test_a_tool_list_read_at_the_old_address_after_the_server_moved_is_not_stored() -> None:
    server = factories.server("slow", url="http://127.0.0.1:9/mcp")
    read = McpServer.objects.get(pk=server.pk)
    _move(server)

    # A held call's session at the old address hears notifications/tools/list_changed and lists them.
    assert servers.server_tools_changed(server.pk, tools=OLD_TOOLS, url=read.url) is None
    # A refresh that read the list at the old address stores nothing either.
    servers._store_tools(read, OLD_TOOLS)

    stored = McpServer.objects.get(pk=server.pk)
    assert stored.tools is None and stored.tools_fetched_at is None
    assert not AuditEvent.objects.filter(verb="server.tools_refreshed").exists()
    # At the address it is registered at, the list is stored.
    assert servers.server_tools_changed(server.pk, tools=OLD_TOOLS, url=stored.url) == OLD_TOOLS
    assert McpServer.objects.get(pk=server.pk).tools == OLD_TOOLS
