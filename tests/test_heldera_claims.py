"""Which queued calls a holder claims: a stdio server runs one call at a time, so its calls are claimed one
by one and never fill the holder's room while other servers' calls wait.

Real PostgreSQL (the claim is one SQL statement); no process is started.
"""

from __future__ import annotations

import sys

import pytest
from django.utils import timezone

from approvals.models import Holder, McpServer, ToolCall
from approvals.services import holding

pytestmark = pytest.mark.django_db


def _stdio_server() -> McpServer:
    return McpServer.objects.create(
        slug="local-tools",
        name="Local tools",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-c", "pass"],
        era=McpServer.Era.HANDSHAKE,
    )


def _handshake_server() -> McpServer:
    return McpServer.objects.create(
        slug="pushy", name="Pushy", url="http://127.0.0.1:9/mcp", era=McpServer.Era.HANDSHAKE
    )


def test_a_stdio_servers_queued_calls_do_not_fill_the_holders_room() -> None:
    holder = Holder.objects.create(name="h1", heartbeat_at=timezone.now())
    stdio = _stdio_server()
    http = _handshake_server()
    stdio_calls = [ToolCall.objects.create(server=stdio, tool="echo") for _ in range(3)]
    http_call = ToolCall.objects.create(server=http, tool="echo")

    got = holding.holder_claim(holder_id=holder.pk, limit=2, stdio=True)

    assert sorted(got) == sorted([str(stdio_calls[0].pk), str(http_call.pk)])
    waiting = ToolCall.objects.filter(pk__in=[c.pk for c in stdio_calls[1:]])
    assert {(c.status, c.holder_id) for c in waiting} == {(ToolCall.Status.QUEUED, None)}


def test_a_stdio_servers_next_call_is_claimed_once_its_running_one_ends() -> None:
    holder = Holder.objects.create(name="h1", heartbeat_at=timezone.now())
    stdio = _stdio_server()
    first, second = (ToolCall.objects.create(server=stdio, tool="echo") for _ in range(2))

    assert holding.holder_claim(holder_id=holder.pk, limit=10, stdio=True) == [str(first.pk)]
    assert holding.holder_claim(holder_id=holder.pk, limit=10, stdio=True) == []

    # Cancelled by its agent: the row may keep its holder until the holder's task ends; it is over anyway.
    ToolCall.objects.filter(pk=first.pk).update(status=ToolCall.Status.CANCELLED)
    assert holding.holder_claim(holder_id=holder.pk, limit=10, stdio=True) == [str(second.pk)]
