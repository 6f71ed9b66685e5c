"""Held calls whose server goes on after their result (it lists no tools, it never ends its session), and
a holder started again under the name of its killed self, run by ``manage.py run_holder``.

Real parts: a stdio server speaking raw JSON-RPC (tests/hld7_raw_server.py, no SDK, so it can do what SDK
servers never do), a handshake-era server over Streamable HTTP written by hand below, the holder process,
PostgreSQL."""
# ruff: noqa: F811  (pytest fixtures are named as arguments)

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from approvals.models import AuditEvent, Holder, McpServer, ToolCall
from approvals.services import holding
from tests import factories
from tests.hub import set_up_handshake_hub
from tests.live import HolderRunner, LoopbackMcpServer, child_env, wait_until

# The fixture `stdio_root` (a directory of its own for the holder's stdio servers), taken as an argument.
from tests.test_std4_stdio_takeover import stdio_root  # noqa: F401

SCRIPT = Path(__file__).resolve().parent / "hld7_raw_server.py"
SLUG = "hld7-raw"


def _server(behaviour: str, **fields: Any) -> McpServer:
    return McpServer.objects.create(
        slug=SLUG,
        name=SLUG,
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[str(SCRIPT)],
        env={"BEHAVIOUR": behaviour},
        era=McpServer.Era.HANDSHAKE,
        **fields,
    )


def _holder(root: Path, **env: str) -> HolderRunner:
    return HolderRunner(
        child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_STDIO_DIR=str(root), **env),
        name="hld7",
    ).start()


def test_a_result_is_recorded_before_the_tools_its_server_says_changed_are_listed(
    live_db: None, stdio_root: Path
) -> None:
    # The server says its tools changed during the call, answers it, then never answers tools/list: the
    # result is the call's at once, not once that listing gives up, and a holder stopped meanwhile keeps it.
    server = _server("changed_stall")
    holder = _holder(stdio_root, ELICIT_MCP_TIMEOUT="60")
    try:
        call = factories.call(server, tool="act", arguments={})
        holding.notify()
        wait_until(lambda: (stdio_root / SLUG / "stalled").is_file(), 30, 0.1, what="the stalled listing")
        wait_until(
            lambda: ToolCall.objects.get(pk=call.pk).status in ToolCall.Status.finals(),
            10,
            0.1,
            what="the call's result",
        )
        assert holder.proc is not None
        holder.proc.send_signal(signal.SIGTERM)
        holder.proc.wait(timeout=30)
    finally:
        holder.stop()
    ended = ToolCall.objects.get(pk=call.pk)
    assert ended.status == ToolCall.Status.COMPLETED, ended.error
    assert ended.result is not None and ended.result["content"][0]["text"] == "done"


class NeverClosed(LoopbackMcpServer):
    """A handshake-era server (2025-06-18, Streamable HTTP, JSON answers) whose DELETE, the client's end of
    its session, is never answered."""

    what = "the server that never answers DELETE"

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    async def endpoint(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.counts["delete"] += 1
            await asyncio.sleep(3600)
        if request.method != "POST":
            return Response(status_code=405)
        body = json.loads(await request.body())
        method, ident = body.get("method"), body.get("id")
        if method is None or method.startswith("notifications/"):
            return Response(status_code=202)
        self.counts[method] += 1
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "never-closed", "version": "1"},
            }
            return JSONResponse(
                {"jsonrpc": "2.0", "id": ident, "result": result},
                headers={"Mcp-Session-Id": secrets.token_hex(8)},
            )
        if method == "tools/list":
            result = {"tools": [{"name": "act", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "done"}]}
        else:
            result = {}
        return JSONResponse({"jsonrpc": "2.0", "id": ident, "result": result})


@pytest.mark.django_db(transaction=True)
def test_a_server_that_never_answers_the_end_of_its_session_neither_delays_the_result_nor_keeps_its_room(
    live_db: None,
) -> None:
    with NeverClosed() as server:
        hub = set_up_handshake_hub(server.url, slug="never-closed")
        holder = HolderRunner(
            child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_MCP_TIMEOUT="3"),
            name="hld7",
        )
        # One call at a time: the second is claimed only once the first's session is let go.
        holder.args += ["--max-calls", "1"]
        holder.start()
        try:
            began = time.monotonic()
            first = hub.agent.call("act", {}, server="never-closed")
            done = wait_until(
                lambda: hub.agent.get(f"/calls/{first}").json()["status"] == "completed",
                10,
                0.1,
                what="the first call's result",
            )
            assert done
            second = hub.agent.call("act", {}, server="never-closed")
            wait_until(
                lambda: hub.agent.get(f"/calls/{second}").json()["status"] == "completed",
                20,
                0.1,
                what="the second call's result",
            )
            # Not the DELETE's read timeout (the call's limit, the server's wait, and a minute more).
            assert time.monotonic() - began < 30
            assert server.counts["delete"] >= 1
        finally:
            holder.stop()


def test_a_holder_started_again_under_its_name_takes_over_from_its_killed_self(
    live_db: None, stdio_root: Path
) -> None:
    # `run_holder --name hld7-fixed` was killed (SIGKILL, the OOM killer): its row is left, holding a call it
    # had sent and one it had not. Started again under the same name, before the sweep ran.
    server = _server("plain")
    old = Holder.objects.create(name="hld7-fixed")
    sent = factories.call(server, tool="act", arguments={}, status=ToolCall.Status.RUNNING, holder=old)
    assert holding.held_sending(call_id=sent.pk, holder_id=old.pk)
    unsent = factories.call(server, tool="echo", arguments={}, status=ToolCall.Status.RUNNING, holder=old)
    Holder.objects.filter(pk=old.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))

    runner = HolderRunner(
        child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1", ELICIT_STDIO_DIR=str(stdio_root)),
        name="hld7",
    )
    runner.args[runner.args.index("--name") + 1] = "hld7-fixed"
    runner.start()
    try:
        # The call that was sent may have run: it fails, never sent again. The other runs here.
        wait_until(
            lambda: ToolCall.objects.get(pk=unsent.pk).status == ToolCall.Status.COMPLETED,
            30,
            0.2,
            what="the unsent call to run on the new holder",
        )
        ended = ToolCall.objects.get(pk=sent.pk)
        assert ended.status == ToolCall.Status.FAILED and ended.error is not None
        assert ended.error["code"] == "holder_lost" and ended.error["tool_may_have_run"] is True
        assert Holder.objects.get(name="hld7-fixed").pk != old.pk
        assert AuditEvent.objects.filter(verb="holder.lost", data__holder="hld7-fixed").count() == 1
    finally:
        runner.stop()


def test_a_live_holders_name_is_not_taken(live_db: None) -> None:
    live = Holder.objects.create(name="hld7-live")
    with pytest.raises(holding.NameTaken):
        holding.holder_start(name="hld7-live")
    assert list(Holder.objects.values_list("pk", flat=True)) == [live.pk]
    Holder.objects.filter(pk=live.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert holding.holder_start(name="hld7-live") != live.pk
