"""Listing a server's tools again from outside its session says what happened: a stdio server's tools are
listed only on its own session, by the holder running it, and a session server that could not be reached
listed nothing; neither is reported as a refresh that ran (a gated send is checked against that list)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import mcp_client
from approvals.models import AuditEvent, McpServer
from approvals.services import servers
from tests import factories, live

pytestmark = pytest.mark.django_db

TOOLS = [{"name": "read_file", "inputSchema": {"type": "object"}}]


def stdio_server() -> McpServer:
    return factories.server(
        "files",
        url="",
        transport=McpServer.Transport.STDIO,
        command="/bin/cat",
        tools=TOOLS,
        tools_fetched_at=timezone.now() - timedelta(hours=2),
    )


def handshake_server_down() -> McpServer:
    return factories.server(
        "legacy",
        url=f"http://127.0.0.1:{live.free_port()}/mcp",
        era=McpServer.Era.HANDSHAKE,
        tools=TOOLS,
        tools_fetched_at=timezone.now() - timedelta(hours=2),
    )


@pytest.mark.parametrize("make", [stdio_server, handshake_server_down])
def test_a_stale_refresh_that_listed_nothing_reports_no_refresh(make: object) -> None:
    server = make()  # type: ignore[operator]
    fetched = server.tools_fetched_at
    assert servers.server_refresh_if_stale(server, max_age=60) is False
    server.refresh_from_db()
    assert server.tools == TOOLS and server.tools_fetched_at == fetched
    assert not AuditEvent.objects.filter(verb="server.tools_refreshed").exists()


@pytest.mark.parametrize("make", [stdio_server, handshake_server_down])
def test_tools_changed_without_a_list_reports_that_nothing_was_listed(make: object) -> None:
    server = make()  # type: ignore[operator]
    assert servers.server_tools_changed(server.pk) is None
    # With the list its holder read on the session, it is stored.
    listed = [{"name": "write_file", "inputSchema": {"type": "object"}}]
    assert servers.server_tools_changed(server.pk, tools=listed) == listed


def test_refreshing_a_stdio_servers_tools_off_its_session_is_an_error_saying_why() -> None:
    with pytest.raises(mcp_client.McpError) as info:
        servers.server_refresh_tools(server=stdio_server())
    assert info.value.code == "not_running" and "holder" in info.value.message
