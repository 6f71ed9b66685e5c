"""A stdio server whose session ends in the middle of a call: what became of the call is unknown.

Real parts: a real stdio MCP server process (tests/hdrev_stdio_server.py, on the `mcp` SDK) run by the
supervisor the holder uses, its lease in PostgreSQL."""

from __future__ import annotations

import pytest

from approvals.holder.stdio import StdioSupervisor
from approvals.mcp_client.outcomes import McpError
from approvals.models import McpServer
from tests.test_hdrev_stdio import MAX_LINE, _call, _stdio_dir, _text, anyio_backend, running

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("live_db")]
__all__ = ["_stdio_dir", "anyio_backend", "running"]  # fixtures


async def test_a_session_ending_mid_call_leaves_the_outcome_open(
    running: tuple[McpServer, StdioSupervisor],
) -> None:
    _, supervisor = running
    # The server's stdout breaks the session after the call was written to it: the tool ran, and what it
    # answered is lost. The holder records such a call outcome_unknown, never a plain failure.
    with pytest.raises(McpError) as lost:
        await _call(supervisor, "huge", {"size": 4 * MAX_LINE})
    assert lost.value.code == "network_error"
    assert lost.value.may_have_run is True
    assert "the tool may have run" in lost.value.message
    # The server is started again: the next call runs.
    assert _text(await _call(supervisor, "echo", {"text": "after"})) == "after"
