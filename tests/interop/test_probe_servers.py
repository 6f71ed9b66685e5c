"""Probing third-party servers for their era, and what a stateless request to a handshake-era one gives."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client

from approvals.mcp_client import PermanentError, ServerConfig, call_tool, run
from approvals.mcp_client.probe import HANDSHAKE, MODERN, probe
from approvals.models import McpServer
from tests.interop.conftest import ThirdPartyServer, everything_stdio_command

pytestmark = pytest.mark.timeout(300)


def config(server: ThirdPartyServer) -> ServerConfig:
    return ServerConfig(url=server.url, timeout=15.0)


def test_server_everything_is_found_to_speak_the_handshake_era(everything_server: ThirdPartyServer) -> None:
    result = run(probe(config(everything_server)))
    assert result.ok and result.era == HANDSHAKE and result.protocol_version == "2025-11-25"
    assert result.server_info is not None and result.server_info["name"] == "mcp-servers/everything"
    names = {tool["name"] for tool in result.tools or []}
    assert {"echo", "trigger-elicitation-request", "trigger-long-running-operation"} <= names
    assert result.tool_count == len(names) and "tools" in result.capabilities


def test_server_everything_pinned_to_2026_is_flagged(everything_server: ThirdPartyServer) -> None:
    result = run(probe(config(everything_server), era=MODERN))
    assert not result.ok and result.era == HANDSHAKE
    assert (
        result.hint == "this server speaks the handshake era (2025-11-25); set its era to handshake or auto"
    )


def test_a_stateless_call_to_server_everything_is_refused_once_not_retried(
    everything_server: ThirdPartyServer,
) -> None:
    # It answers 400 "Server not initialized" (JSON-RPC -32000): never a network error to retry.
    with pytest.raises(PermanentError) as info:
        run(call_tool(config(everything_server), "echo", {"message": "hi"}))
    assert info.value.code == "protocol_unsupported" and not info.value.transient
    assert "tools/list" in info.value.message and "Server not initialized" in info.value.message


def test_fastmcp2_on_mcp1_is_found_to_speak_the_handshake_era(fastmcp2_server: ThirdPartyServer) -> None:
    result = run(probe(config(fastmcp2_server)))
    assert result.ok and result.era == HANDSHAKE and result.tools
    with pytest.raises(PermanentError) as info:
        run(call_tool(config(fastmcp2_server), "add", {"a": 1, "b": 2}))
    assert (
        info.value.code == "protocol_unsupported" and "set its era to handshake or auto" in info.value.message
    )


@pytest.mark.parametrize("fixture", ["fastmcp4_server", "mcp23_server"])
def test_dual_era_servers_are_found_to_speak_2026(fixture: str, request: pytest.FixtureRequest) -> None:
    server: ThirdPartyServer = request.getfixturevalue(fixture)
    result = run(probe(config(server)))
    assert result.ok and result.era == MODERN and result.discover is not None and result.tools
    # The era setting "handshake" still finds them, on a handshake-era session.
    legacy = run(probe(config(server), era=HANDSHAKE))
    assert legacy.ok and legacy.era == HANDSHAKE and legacy.tool_count == result.tool_count


def test_server_everything_over_stdio_through_a_transport_factory(interop_installed: None) -> None:
    command, args = everything_stdio_command()
    params = StdioServerParameters(command=command, args=args)
    result = run(probe(lambda: stdio_client(params), timeout=30.0))
    assert result.ok and result.era == HANDSHAKE
    assert "echo" in {tool["name"] for tool in result.tools or []}


@pytest.fixture
def everything_registered(everything_server: ThirdPartyServer, live_db: None) -> Iterator[str]:
    out = StringIO()
    call_command("add_server", "everything", everything_server.url, stdout=out)
    yield out.getvalue()


def test_add_server_and_check_server_on_server_everything(everything_registered: str) -> None:
    assert "era handshake (2025-11-25)" in everything_registered
    server = McpServer.objects.get(slug="everything")
    assert server.needs_session and server.tool("echo") is not None
    out = StringIO()
    call_command("check_server", "everything", stdout=out)
    assert "mcp-servers/everything" in out.getvalue()
