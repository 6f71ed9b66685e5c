"""Probing servers for their era: the pure probe against real servers of both eras, the errors a
handshake-era server gives a stateless request, and what the hub stores and prints (add_server,
check_server, the tool-list refreshes)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client as DjangoClient
from django.utils import timezone
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from approvals.mcp_client import (
    PermanentError,
    ServerConfig,
    ToolError,
    TransientError,
    call_tool,
    classify_rpc_error,
    run,
)
from approvals.mcp_client.probe import HANDSHAKE, MODERN, ProbeResult, probe, probe_open
from approvals.mcp_client.wire import HttpFacts
from approvals.models import AuditEvent, InputRequest, McpServer, RoutingRule, ToolCall
from approvals.services import servers, tokens
from tests import demo_support, factories
from tests.hub import Agent
from tests.live import HolderRunner, child_env, free_port, start_script, wait_until

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent


class Running:
    def __init__(self, script: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/mcp"
        self.proc = start_script(HERE / script, [str(self.port)], self._answers, script)

    def _answers(self) -> None:
        """Returns once the server answers anything (an error status too); OSError until then."""
        try:
            urllib.request.urlopen(urllib.request.Request(self.base + "/_add_tool", method="HEAD"), timeout=2)
        except urllib.error.HTTPError:
            return

    def config(self, path: str = "/mcp") -> ServerConfig:
        return ServerConfig(url=self.base + path, timeout=10.0)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def handshake() -> Iterator[Running]:
    """mcp 2.3 behind a shim: only the handshake era (400 "Missing session ID" to stateless requests)."""
    server = Running("handshake_server.py")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def modern() -> Iterator[Running]:
    """The 2026-07-28 test server (stateless mcp 2.3)."""
    server = Running("mcp_test_server.py")
    yield server
    server.stop()


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}/mcp"


# ---- the probe itself -------------------------------------------------------------------------------


def test_a_2026_server_is_found_by_discover(modern: Running) -> None:
    result = run(probe(modern.config()))
    assert result.ok and result.era == MODERN and result.protocol_version == "2026-07-28"
    assert result.server_info == {"name": "elicit-hub-test-server", "version": "1.0.0"}
    assert result.discover is not None and "2026-07-28" in result.discover["supportedVersions"]
    assert result.tools is not None and result.tool_count == len(result.tools) > 5
    assert "echo" in {tool["name"] for tool in result.tools}
    assert "tools" in result.capabilities
    assert isinstance(result.latency_ms, int) and result.error is None and result.hint is None


def test_a_handshake_server_falls_back_to_initialize(handshake: Running) -> None:
    result = run(probe(handshake.config()))
    found = result.as_json()
    assert found["ok"] is True and found["era"] == HANDSHAKE
    assert found["protocol_version"] == "2025-11-25"
    assert found["server_info"] == {"name": "handshake-test-server", "version": "3.1.4"}
    assert found["tool_count"] == 3 and found["error"] is None
    assert set(found) == {
        "ok", "era", "protocol_version", "server_info", "capabilities", "tool_count", "latency_ms", "error",
        "hint", "probed_at",
    }  # fmt: skip
    tools = {tool["name"]: tool for tool in result.tools or []}
    assert set(tools) == {"echo", "wipe", "ask"}
    assert tools["wipe"]["annotations"]["destructiveHint"] is True
    assert result.discover is None


def test_a_handshake_session_id_reaches_no_log_line(
    handshake: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK's transport logs the session id a server gives at INFO ("Received session ID: ..."): with it
    anyone reading the logs could send requests on the hub's session. The logging settings keep it out."""
    result = run(probe(handshake.config()))
    assert result.ok and result.era == HANDSHAKE
    said = [record.getMessage() for record in caplog.records]
    assert not [line for line in said if "session id" in line.lower()], said


def test_a_handshake_server_pinned_to_2026_is_flagged_with_a_hint(handshake: Running) -> None:
    result = run(probe(handshake.config(), era=MODERN))
    assert not result.ok and result.era == HANDSHAKE
    assert result.error is not None and result.error["code"] == "protocol_unsupported"
    assert (
        result.hint == "this server speaks the handshake era (2025-11-25); set its era to handshake or auto"
    )


def test_era_handshake_speaks_only_the_handshake(modern: Running) -> None:
    # The mcp 2.3 server serves both eras: pinned to the handshake, no server/discover is sent.
    result = run(probe(modern.config(), era=HANDSHAKE))
    assert result.ok and result.era == HANDSHAKE and result.discover is None
    assert result.protocol_version == "2025-11-25"


def test_an_unreachable_server_is_a_result_not_an_exception() -> None:
    result = run(probe(ServerConfig(url=closed_url(), timeout=5.0)))
    assert not result.ok and result.era is None and not result.reachable
    assert result.error is not None and result.error["code"] == "connect_failed"
    assert result.hint is not None and "unreachable" in result.hint


def test_something_that_is_not_an_mcp_server_is_flagged(handshake: Running) -> None:
    result = run(probe(handshake.config("/no-such-endpoint")))
    assert not result.ok and result.era is None and result.reachable
    assert result.error is not None and result.hint


def test_the_probe_takes_any_sdk_transport(handshake: Running) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[str(HERE / "handshake_server.py"), "--stdio"]
    )
    result = run(probe(lambda: stdio_client(params), era=HANDSHAKE, timeout=20.0))
    assert result.ok and result.era == HANDSHAKE
    assert {tool["name"] for tool in result.tools or []} == {"echo", "wipe", "ask"}


# ---- errors from a handshake-era server to a stateless request ------------------------------------


def test_a_stateless_call_to_a_handshake_server_is_protocol_unsupported_naming_tools_list(
    handshake: Running,
) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(handshake.config(), "echo", {"text": "hi"}))
    err = info.value
    assert err.code == "protocol_unsupported" and not err.transient
    assert "tools/list" in err.message and "tools/call" not in err.message
    assert "Missing session ID" in err.message
    assert "set its era to handshake or auto" in err.message


def test_a_failing_tools_call_names_tools_call(modern: Running) -> None:
    with pytest.raises(PermanentError) as info:
        run(call_tool(modern.config("/scripted/rpc_error"), "anything", {}))
    assert "tools/call 'anything'" in info.value.message


@pytest.mark.parametrize(
    ("code", "message", "status"),
    [
        (-32000, "Bad Request: Server not initialized", 400),  # TypeScript SDK (server-everything)
        (-32600, "Bad Request: Missing session ID", 400),  # mcp 1.x, FastMCP 2.x
        (-32000, "Bad Request: No valid session ID provided", 400),
        (-32600, "Bad Request: Unsupported protocol version: 2026-07-28. Supported: 2025-06-18", 400),
    ],
)
def test_handshake_refusals_are_protocol_unsupported_never_transient(
    code: int, message: str, status: int
) -> None:
    err = classify_rpc_error(code, message, None, HttpFacts(status, "application/json"), what="tools/list")
    assert isinstance(err, PermanentError) and err.code == "protocol_unsupported"
    assert "tools/list" in err.message and "set its era to handshake or auto" in err.message
    if "2025-06-18" in message:
        assert "handshake era (2025-06-18)" in err.message


def test_a_closed_connection_is_still_transient_and_a_version_refusal_hints_the_era() -> None:
    assert isinstance(classify_rpc_error(-32000, "Connection closed", None), TransientError)
    err = classify_rpc_error(
        -32022, "Unsupported", {"supported": ["2025-06-18", "2025-11-25"]}, HttpFacts(400, "application/json")
    )
    assert err.code == "protocol_unsupported" and "handshake era (2025-11-25)" in err.message


def test_unknown_tools_and_header_mismatches_have_their_own_codes() -> None:
    unknown = classify_rpc_error(-32602, "Tool nope not found", None, HttpFacts(200, "application/json"))
    assert unknown.code == "unknown_tool" and not unknown.transient
    assert classify_rpc_error(-32602, "Unknown tool: nope", None).code == "unknown_tool"
    assert classify_rpc_error(-32020, "Header mismatch", None).code == "header_mismatch"


# ---- what the hub stores and prints -----------------------------------------------------------------


def out_of(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_server_probe_stores_era_tools_and_discover_and_audits(modern: Running, handshake: Running) -> None:
    new = McpServer.objects.create(slug="new", name="New", url=modern.url)
    found = servers.server_probe(new)
    new.refresh_from_db()
    assert new.probe == found and found["era"] == MODERN and new.probed_at is not None
    assert new.discover is not None and new.tools and new.tools_fetched_at is not None
    assert not new.needs_session

    old = McpServer.objects.create(slug="old", name="Old", url=handshake.url)
    servers.server_probe(old)
    old.refresh_from_db()
    assert old.probe["era"] == HANDSHAKE and old.discover is None and old.needs_session
    assert {tool["name"] for tool in old.tools} == {"echo", "wipe", "ask"}
    event = AuditEvent.objects.filter(verb="server.probed").latest("id")
    assert event.data["server"] == "old" and event.data["era"] == HANDSHAKE and event.data["tool_count"] == 3


@pytest.mark.django_db
def test_a_failed_probe_keeps_the_stored_tool_list() -> None:
    server = McpServer.objects.create(slug="gone", name="Gone", url=closed_url(), tools=[{"name": "kept"}])
    found = servers.server_probe(server)
    server.refresh_from_db()
    assert found["ok"] is False and server.probe["error"]["code"] == "connect_failed"
    assert server.tools == [{"name": "kept"}]


@pytest.mark.django_db
def test_add_server_probes_and_shows_the_result(handshake: Running) -> None:
    output = out_of("add_server", "legacy", handshake.url)
    server = McpServer.objects.get(slug="legacy")
    assert server.era == McpServer.Era.AUTO and server.probe["era"] == HANDSHAKE
    assert "era handshake (2025-11-25)" in output and "server handshake-test-server 3.1.4" in output
    assert "3 tool(s)" in output and " ms" in output
    assert {tool["name"] for tool in server.tools} == {"echo", "wipe", "ask"}

    output = out_of("add_server", "legacy", handshake.url, "--era", "2026-07-28")
    server.refresh_from_db()
    assert server.era == "2026-07-28" and server.probe["ok"] is False
    assert "NOT USABLE" in output and "hint: this server speaks the handshake era" in output
    # Updating without --era keeps the setting.
    out_of("add_server", "legacy", handshake.url, "--no-probe")
    assert McpServer.objects.get(slug="legacy").era == "2026-07-28"


@pytest.mark.django_db
def test_add_server_registers_an_unreachable_server_and_flags_it() -> None:
    output = out_of("add_server", "later", closed_url())
    server = McpServer.objects.get(slug="later")
    assert server.probe["ok"] is False and server.tools is None
    assert "probe: unreachable" in output and "hint:" in output and "registered all the same" in output


@pytest.mark.django_db
def test_check_server_prints_the_probe_and_exits_non_zero_when_unreachable(handshake: Running) -> None:
    McpServer.objects.create(slug="legacy", name="Legacy", url=handshake.url)
    human = out_of("check_server", "legacy")
    assert "era handshake" in human and "2025-11-25" in human and "wipe" in human
    machine = json.loads(out_of("check_server", "legacy", "--json"))
    assert machine["era"] == HANDSHAKE and machine["tool_count"] == 3

    McpServer.objects.create(slug="gone", name="Gone", url=closed_url())
    with pytest.raises(CommandError) as info:
        out_of("check_server", "gone")
    assert info.value.returncode == 1
    McpServer.objects.create(slug="pinned", name="Pinned", url=handshake.url, era="2026-07-28")
    with pytest.raises(CommandError) as info:
        out_of("check_server", "pinned", "--json")
    assert info.value.returncode == 2
    with pytest.raises(CommandError, match="unknown server"):
        out_of("check_server", "nope")


def test_check_server_exit_status_from_the_shell(handshake: Running, live_db: None) -> None:
    McpServer.objects.create(slug="gone", name="Gone", url=closed_url())
    done = subprocess.run(
        [sys.executable, "manage.py", "check_server", "gone", "--json"],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        env={**__import__("os").environ, **_database_env()},
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["error"]["code"] == "connect_failed"


def _database_env() -> dict[str, str]:
    from tests.live import test_database_url

    return {"DATABASE_URL": test_database_url(), "DJANGO_DEBUG": "true"}


# ---- refreshing tool lists --------------------------------------------------------------------------


@pytest.mark.django_db
def test_beat_refreshes_only_lists_older_than_the_interval(modern: Running, settings) -> None:
    settings.ELICIT_TOOLS_REFRESH_INTERVAL = 600
    now = timezone.now()
    stale = McpServer.objects.create(
        slug="stale", name="S", url=modern.url, tools=[], tools_fetched_at=now - timedelta(seconds=601)
    )
    fresh = McpServer.objects.create(
        slug="fresh", name="F", url=modern.url, tools=[], tools_fetched_at=now - timedelta(seconds=30)
    )
    never = McpServer.objects.create(slug="never", name="N", url=modern.url)
    McpServer.objects.create(slug="off", name="O", url=modern.url, enabled=False)
    # Unreachable and probed a minute ago: not tried again at every tick.
    McpServer.objects.create(slug="down", name="D", url=closed_url(), probed_at=now - timedelta(seconds=60))
    assert servers.servers_refresh_stale() == 2
    stale.refresh_from_db()
    fresh.refresh_from_db()
    never.refresh_from_db()
    assert stale.tools and never.tools and fresh.tools == []
    assert servers.servers_refresh_stale() == 0


@pytest.mark.django_db
def test_tools_list_changed_relists_or_stores_what_the_session_listed() -> None:
    handshake = Running("handshake_server.py")  # its own: the test adds a tool
    try:
        _relist(handshake)
    finally:
        handshake.stop()


def _relist(handshake: Running) -> None:
    server = McpServer.objects.create(slug="legacy", name="Legacy", url=handshake.url)
    servers.server_probe(server)
    assert "extra" not in {tool["name"] for tool in McpServer.objects.get(pk=server.pk).tools}
    urllib.request.urlopen(urllib.request.Request(handshake.base + "/_add_tool", method="POST"), timeout=5)
    listed = servers.server_tools_changed(server.pk)
    assert listed is not None and "extra" in {tool["name"] for tool in listed}
    assert "extra" in {tool["name"] for tool in McpServer.objects.get(pk=server.pk).tools}

    servers.server_tools_changed(server.pk, tools=[{"name": "only"}])
    assert McpServer.objects.get(pk=server.pk).tools == [{"name": "only"}]
    assert servers.server_tools_changed(10**9) is None


# ---- end to end: the worker, the demo server ----------------------------------------------------------


def _agent_for(server: McpServer) -> Agent:
    _, token = tokens.agent_create(name=f"{server.slug}-agent", servers=[server])
    return Agent(token)


def _request_of(call_id: str) -> InputRequest:
    return wait_until(  # type: ignore[return-value]
        lambda: InputRequest.objects.filter(round__call_id=call_id).select_related("team").first(),
        30,
        0.1,
        what="the input request",
    )


def test_a_server_added_with_add_server_routes_on_destructive_hint(worker, demo_server) -> None:
    demo_support.reset(demo_server.url)
    factories.team("release")
    ops = factories.team("ops")
    out_of("add_server", "demo", demo_server.url, "--team", "release")
    server = McpServer.objects.get(slug="demo")
    assert server.probe["ok"] is True and server.probe["era"] == MODERN
    assert server.tool("create_deployment")["annotations"]["destructiveHint"] is True
    RoutingRule.objects.create(position=10, name="destructive tools", destructive=True, team=ops)

    call_id = _agent_for(server).call("create_deployment", {"branch": "main", "environment": "production"})
    request = _request_of(call_id)
    assert request.team == ops and request.routing["matched"] == "destructive tools"


def test_a_stale_tool_list_is_fetched_again_before_the_round_is_routed(worker, demo_server) -> None:
    demo_support.reset(demo_server.url)
    ops = factories.team("ops")
    old = timezone.now() - timedelta(hours=2)
    server = McpServer.objects.create(
        slug="demo", name="Demo", url=demo_server.url, default_team=factories.team("release"), tools=[],
        tools_fetched_at=old,
    )  # fmt: skip
    RoutingRule.objects.create(position=10, name="destructive tools", destructive=True, team=ops)
    call_id = _agent_for(server).call("create_deployment", {"branch": "main", "environment": "production"})
    assert _request_of(call_id).team == ops
    server.refresh_from_db()
    assert server.tool("create_deployment") is not None and server.tools_fetched_at > old


def test_a_handshake_server_under_auto_is_probed_again_and_the_call_waits_for_a_session(
    worker, handshake: Running
) -> None:
    server = McpServer.objects.create(slug="legacy", name="Legacy", url=handshake.url)
    assert not server.needs_session  # never probed: sent as 2026-07-28
    call_id = _agent_for(server).call("echo", {"text": "hi"}, server="legacy")
    moved = wait_until(
        lambda: AuditEvent.objects.filter(call_id=call_id, verb="call.moved_to_session").first(),
        30,
        0.1,
        what="the call moved to a session",
    )
    assert "Missing session ID" in moved.data["refused"] and moved.data["era"] == HANDSHAKE
    server.refresh_from_db()
    assert server.probe["era"] == HANDSHAKE and server.needs_session
    call = ToolCall.objects.get(pk=call_id)
    # Refused without a session, nothing ran: back in the queue for a holder, not failed, not retried.
    assert call.status == ToolCall.Status.QUEUED and call.error is None and call.holder is None
    assert call.attempts == 1
    assert not AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").exists()


def test_a_call_to_a_server_found_to_speak_the_handshake_era_completes_on_a_holders_session(
    worker, handshake: Running
) -> None:
    runner = HolderRunner(child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1")).start()
    try:
        server = McpServer.objects.create(slug="legacy", name="Legacy", url=handshake.url)
        agent = _agent_for(server)
        call_id = agent.call("echo", {"text": "hi"}, server="legacy")
        body = agent.wait(call_id, 30)
        if body["status"] not in ("completed", "failed"):
            body = wait_until(  # type: ignore[assignment]
                lambda: (b := agent.wait(call_id, 5))["status"] in ("completed", "failed") and b,
                30,
                0.2,
                what="the call to end",
            )
        assert body["status"] == "completed", body
        assert body["result"]["content"][0]["text"] == "echo: hi"
        verbs = list(AuditEvent.objects.filter(call_id=call_id).order_by("id").values_list("verb", flat=True))
        assert verbs.index("call.moved_to_session") < verbs.index("call.held") < verbs.index("call.completed")
    finally:
        runner.stop()


# ---- the admin ------------------------------------------------------------------------------------------


def _admin_client() -> DjangoClient:
    client = DjangoClient()
    client.force_login(factories.user("root", is_staff=True, is_superuser=True))
    return client


def _add_form(slug: str, url: str, era: str = "auto") -> dict[str, str]:
    return {
        "slug": slug, "name": slug.title(), "url": url, "era": era, "enabled": "on", "default_team": "",
        "round_ttl": "", "on_expiry": "", "new_headers": "",
    }  # fmt: skip


@pytest.mark.django_db
def test_the_admin_probes_a_server_it_adds_and_shows_era_and_probe(handshake: Running) -> None:
    client = _admin_client()
    response = client.post("/admin/approvals/mcpserver/add/", _add_form("legacy", handshake.url), follow=True)
    assert response.status_code == 200
    server = McpServer.objects.get(slug="legacy")
    assert server.probe["era"] == HANDSHAKE and {t["name"] for t in server.tools} == {"echo", "wipe", "ask"}
    page = response.content.decode()
    assert "Probe of legacy: ok: era handshake (2025-11-25)" in page and "3 tool(s)" in page
    listing = client.get("/admin/approvals/mcpserver/").content.decode()
    assert "ok: era handshake (2025-11-25), server handshake-test-server 3.1.4, 3 tool(s)" in listing
    change = client.get(f"/admin/approvals/mcpserver/{server.pk}/change/").content.decode()
    assert "Tools: echo, wipe, ask" in change and 'name="era"' in change

    # The era is editable; pinned to 2026-07-28 the server is flagged at once, with a hint.
    form = _add_form("legacy", handshake.url, era="2026-07-28")
    response = client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", form, follow=True)
    server.refresh_from_db()
    assert server.era == "2026-07-28" and server.probe["ok"] is False
    page = response.content.decode()
    assert "NOT USABLE" in page and "set its era to handshake or auto" in page


@pytest.mark.django_db
def test_the_admin_registers_an_unreachable_server_and_flags_it() -> None:
    client = _admin_client()
    response = client.post("/admin/approvals/mcpserver/add/", _add_form("later", closed_url()), follow=True)
    assert response.status_code == 200
    server = McpServer.objects.get(slug="later")
    assert server.probe["error"]["code"] == "connect_failed"
    page = response.content.decode()
    assert "Probe of later: unreachable" in page and "registered all the same" in page


@pytest.mark.django_db
def test_a_probe_on_an_open_session_is_stored_for_a_stdio_server() -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[str(HERE / "handshake_server.py"), "--stdio"]
    )

    async def on_session() -> ProbeResult:
        async with Client(stdio_client(params), mode="legacy") as client:
            return await probe_open(client, latency_ms=7)

    result = run(on_session())
    assert result.ok and result.era == HANDSHAKE and result.latency_ms == 7
    server = McpServer.objects.create(slug="local", name="Local", transport="stdio", command="srv")
    # Without a result or a transport the hub does not start a second copy of a stdio server.
    assert servers.server_probe(server)["error"]["code"] == "not_running"
    assert McpServer.objects.get(pk=server.pk).probe is None
    servers.server_probe(server, result=result)
    server.refresh_from_db()
    assert server.probe["era"] == HANDSHAKE and {t["name"] for t in server.tools} == {"echo", "wipe", "ask"}
    assert server.needs_session


@pytest.mark.django_db
def test_an_unknown_tool_or_a_header_mismatch_lists_the_tools_again_unless_just_listed(
    modern: Running,
) -> None:
    old = timezone.now() - timedelta(minutes=5)
    server = McpServer.objects.create(
        slug="m", name="M", url=modern.url, tools=[{"name": "echo"}], tools_fetched_at=old
    )
    unknown = ToolError({"content": [{"type": "text", "text": "Unknown tool: gone"}], "isError": True})
    servers.server_after_send(server, "echo", outcome=unknown)
    server.refresh_from_db()
    assert server.tools_fetched_at > old and len(server.tools) > 1
    listed_at = server.tools_fetched_at

    # Just listed: several workers meeting the same unknown tool do not list it again each.
    servers.server_after_send(server, "gone", error=PermanentError("unknown_tool", "x"))
    server.refresh_from_db()
    assert server.tools_fetched_at == listed_at

    McpServer.objects.filter(pk=server.pk).update(tools_fetched_at=old)
    server.refresh_from_db()
    servers.server_after_send(server, "echo", error=PermanentError("header_mismatch", "x"))
    server.refresh_from_db()
    assert server.tools_fetched_at > old

    # A tool the stored list has, answered normally: nothing to do.
    McpServer.objects.filter(pk=server.pk).update(tools_fetched_at=old)
    server.refresh_from_db()
    servers.server_after_send(server, "echo", outcome=ToolError({"content": [], "isError": True}))
    server.refresh_from_db()
    assert server.tools_fetched_at == old


def test_what_a_probe_keeps_is_storable_and_bounded() -> None:
    from approvals.mcp_client.probe import _Found, _success

    found = _Found(
        era=HANDSHAKE,
        protocol_version="2025-11-25",
        server_info={"name": "x" * 5000, "version": "1\x00", "icons": [{"src": "data:..."}]},
        capabilities={"tools": {"listChanged": True}, "experimental": {"blob": "y" * 50_000}},
        latency_ms=3,
        tools=[{"name": "ok"}, {"name": "bad", "description": "nul \x00 here"}, {"name": "lone \ud800"}],
    )
    result = _success(found)
    assert result.server_info == {"name": "x" * 200}
    assert result.capabilities == {"tools": {}, "experimental": {}}
    assert result.tools == [{"name": "ok"}] and result.tool_count == 1
    json.dumps(result.as_json())  # storable as it is


@pytest.mark.django_db
def test_check_server_on_a_stdio_server_shows_what_its_holder_found_without_starting_it() -> None:
    McpServer.objects.create(slug="local", name="Local", transport="stdio", command="/bin/false")
    with pytest.raises(CommandError) as info:
        out_of("check_server", "local")
    assert info.value.returncode == 1  # never started by anyone yet: unreachable
    found = {"ok": True, "era": HANDSHAKE, "protocol_version": "2025-11-25", "tool_count": 2, "latency_ms": 5}
    McpServer.objects.filter(slug="local").update(probe=found, tools=[{"name": "a"}, {"name": "b"}])
    human = out_of("check_server", "local")
    assert "ok: era handshake (2025-11-25), 2 tool(s), 5 ms" in human and "a, b" in human


@pytest.mark.django_db
def test_refused_credentials_are_flagged_and_never_stored_or_audited(modern: Running) -> None:
    secret = "Bearer s3cret-probe-token"
    server = McpServer.objects.create(
        slug="locked",
        name="Locked",
        url=modern.base + "/scripted/unauthorized",
        headers={"Authorization": secret},
    )
    found = servers.server_probe(server)
    assert found["ok"] is False and found["error"]["code"] == "auth_failed"
    assert found["hint"] is not None and "credentials" in found["hint"]
    event = AuditEvent.objects.filter(verb="server.probed").latest("id")
    assert "s3cret" not in json.dumps(found) and "s3cret" not in json.dumps(event.data)


def test_a_server_offering_only_older_versions_to_discover_falls_back(modern: Running) -> None:
    # -32022 naming only handshake-era versions: the server is not modern; the fallback decides.
    result = run(probe(modern.config("/scripted/old_version")))
    assert not result.ok and result.error is not None and result.error["code"] == "protocol_unsupported"
    assert result.hint is not None and result.hint.startswith(
        "the server and the hub share no protocol version"
    )
