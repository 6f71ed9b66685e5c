"""The demo MCP server, driven over real HTTP by the official SDK client (and raw JSON-RPC where the
test needs control of the exact bytes and headers)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import mcp
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
    InputResponses,
)

from tests.demo_support import (
    DemoServer,
    executions,
    hold,
    inflight,
    recorded_requests,
    reset,
    wait_for_held,
)

BRANCH = "feature/login"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def session(url: str) -> AsyncIterator[ClientSession]:
    async def refuse(context: Any, params: Any) -> ElicitResult:
        raise AssertionError("the session layer must hand input_required back, never call the callback")

    # The callback is what makes the SDK declare the elicitation capability (form and url).
    async with mcp.Client(url, mode="2026-07-28", elicitation_callback=refuse) as client:
        await client.list_tools()
        yield client.session


async def call(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    answers: Mapping[str, ElicitResult] | None = None,
    state: str | None = None,
) -> CallToolResult | InputRequiredResult:
    responses: InputResponses | None = None if answers is None else {**answers}
    async with session(url) as s:
        try:
            return await s.call_tool(
                tool, arguments, input_responses=responses, request_state=state, allow_input_required=True
            )
        except MCPError as error:
            # Raised out of the `async with`, it would arrive wrapped in the Client's ExceptionGroup.
            rejected = error
    raise rejected


def accept(**content: Any) -> ElicitResult:
    return ElicitResult(action="accept", content=content)


def text_of(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


def elicitation(result: object, key: str) -> ElicitRequestFormParams | ElicitRequestURLParams:
    assert isinstance(result, InputRequiredResult) and result.input_requests is not None
    request = result.input_requests[key]
    assert isinstance(request, ElicitRequest)
    return request.params


def form_schema(result: object, key: str) -> dict[str, Any]:
    params = elicitation(result, key)
    assert isinstance(params, ElicitRequestFormParams) and params.mode == "form"
    return params.requested_schema


async def ask_environment(url: str) -> InputRequiredResult:
    first = await call(url, "create_deployment", {"branch": BRANCH})
    assert isinstance(first, InputRequiredResult)
    return first


async def retry_deployment(
    url: str, state: str | None, **answers: ElicitResult
) -> CallToolResult | InputRequiredResult:
    return await call(url, "create_deployment", {"branch": BRANCH}, answers, state)


# --- create_deployment --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_create_deployment_first_asks_for_the_environment(url: str) -> None:
    first = await ask_environment(url)

    assert set(first.input_requests or {}) == {"environment"}
    schema = form_schema(first, "environment")
    assert schema["required"] == ["environment"]
    choices = {option["const"] for option in schema["properties"]["environment"]["oneOf"]}
    assert choices == {"staging", "production"}
    assert isinstance(first.request_state, str) and first.request_state
    assert executions(url) == {}


@pytest.mark.anyio
async def test_staging_deploys_after_one_round(url: str) -> None:
    first = await ask_environment(url)

    done = await retry_deployment(url, first.request_state, environment=accept(environment="staging"))

    assert isinstance(done, CallToolResult) and not done.is_error
    assert text_of(done) == f"Deployed {BRANCH} to staging"
    assert done.structured_content["environment"] == "staging"
    assert executions(url) == {"create_deployment": 1}


@pytest.mark.anyio
async def test_production_asks_for_a_confirmation_before_deploying(url: str) -> None:
    first = await ask_environment(url)

    second = await retry_deployment(url, first.request_state, environment=accept(environment="production"))

    assert isinstance(second, InputRequiredResult)
    assert set(second.input_requests or {}) == {"confirm"}
    message = elicitation(second, "confirm").message
    assert BRANCH in message and "production" in message.lower()
    schema = form_schema(second, "confirm")
    assert schema["properties"]["confirm"]["type"] == "boolean"
    assert schema["properties"]["reason"]["type"] == "string"
    assert schema["required"] == ["confirm"]
    assert second.request_state != first.request_state
    assert executions(url) == {}

    done = await retry_deployment(
        url, second.request_state, confirm=accept(confirm=True, reason="release 42")
    )

    assert isinstance(done, CallToolResult) and not done.is_error
    assert text_of(done) == f"Deployed {BRANCH} to production"
    assert done.structured_content["reason"] == "release 42"
    assert executions(url) == {"create_deployment": 1}


@pytest.mark.anyio
async def test_declining_the_environment_ends_the_call_with_a_tool_error(url: str) -> None:
    first = await ask_environment(url)

    done = await retry_deployment(url, first.request_state, environment=ElicitResult(action="decline"))

    assert isinstance(done, CallToolResult) and done.is_error
    assert text_of(done) == f"Deployment of {BRANCH} was declined by the reviewer."
    assert executions(url) == {}


@pytest.mark.anyio
async def test_cancelling_the_production_confirmation_deploys_nothing(url: str) -> None:
    first = await ask_environment(url)
    second = await retry_deployment(url, first.request_state, environment=accept(environment="production"))
    assert isinstance(second, InputRequiredResult)

    done = await retry_deployment(url, second.request_state, confirm=ElicitResult(action="cancel"))

    assert isinstance(done, CallToolResult) and done.is_error
    assert "cancelled by the reviewer" in text_of(done)
    assert executions(url) == {}


@pytest.mark.anyio
async def test_missing_or_invalid_answers_are_asked_again(url: str) -> None:
    first = await ask_environment(url)

    missing = await retry_deployment(url, first.request_state, unrelated=accept(environment="staging"))
    invalid = await retry_deployment(url, first.request_state, environment=accept(environment="qa"))

    assert isinstance(missing, InputRequiredResult) and set(missing.input_requests or {}) == {"environment"}
    assert isinstance(invalid, InputRequiredResult) and set(invalid.input_requests or {}) == {"environment"}
    assert "environment: 'qa' is not one of the choices" in elicitation(invalid, "environment").message
    assert executions(url) == {}


# --- requestState ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_tampered_request_state_is_rejected_with_a_json_rpc_error(url: str) -> None:
    first = await ask_environment(url)
    state = first.request_state
    assert state is not None
    middle = len(state) // 2
    tampered = state[:middle] + ("A" if state[middle] != "A" else "B") + state[middle + 1 :]

    with pytest.raises(MCPError) as rejected:
        await retry_deployment(url, tampered, environment=accept(environment="staging"))

    assert rejected.value.code == INVALID_PARAMS
    assert rejected.value.data == {"reason": "invalid_request_state"}
    assert executions(url) == {}


@pytest.mark.anyio
async def test_request_state_survives_a_restart_but_not_a_new_key() -> None:
    with DemoServer() as server:
        first = await ask_environment(server.url)
        second = await retry_deployment(
            server.url, first.request_state, environment=accept(environment="production")
        )
        assert isinstance(second, InputRequiredResult)

        server.restart()
        done = await retry_deployment(server.url, second.request_state, confirm=accept(confirm=True))

        assert isinstance(done, CallToolResult) and text_of(done) == f"Deployed {BRANCH} to production"

        server.restart(env={"ELICIT_DEMO_STATE_KEY": "another-key-of-at-least-thirty-two-bytes!"})
        with pytest.raises(MCPError) as rejected:
            await retry_deployment(server.url, second.request_state, confirm=accept(confirm=True))
        assert rejected.value.code == INVALID_PARAMS


# --- schedule_meeting, connect_account, echo, fail -------------------------------------------------

MEETING = {
    "title": "Quarterly planning",
    "organizer_email": "ada@example.com",
    "agenda_url": "https://docs.example.com/agenda",
    "date": "2026-09-01",
    "starts_at": "2026-09-01T09:30:00Z",
    "duration_hours": 1.5,
    "attendees": 6,
    "recorded": True,
    "room": "cosmos",
    "priority": "high",
    "timezone": "Europe/Paris",
    "topics": ["roadmap", "budget"],
    "equipment": ["projector", "video"],
}


def shapes(schema: dict[str, Any]) -> set[str]:
    """The 2026-07-28 field shapes a form schema uses, named as in the spec's table."""
    found = set()
    for prop in schema["properties"].values():
        if prop["type"] == "string" and "oneOf" in prop:
            found.add("titled single-select")
        elif prop["type"] == "string" and "enumNames" in prop:
            found.add("legacy enumNames")
        elif prop["type"] == "string" and "enum" in prop:
            found.add("untitled single-select")
        elif prop["type"] == "string":
            found.add(f"string format {prop['format']}" if "format" in prop else "string")
            if {"minLength", "maxLength"} <= prop.keys():
                found.add("string length bounds")
        elif prop["type"] in ("number", "integer") and {"minimum", "maximum"} <= prop.keys():
            found.add(f"{prop['type']} with bounds")
        elif prop["type"] == "boolean" and "default" in prop:
            found.add("boolean with default")
        elif prop["type"] == "array" and "enum" in prop["items"]:
            if {"minItems", "maxItems"} <= prop.keys():
                found.add("untitled multi-select")
        elif prop["type"] == "array" and "anyOf" in prop["items"]:
            found.add("titled multi-select")
    return found


@pytest.mark.anyio
async def test_schedule_meeting_asks_with_every_schema_shape(url: str) -> None:
    first = await call(url, "schedule_meeting", {})

    assert isinstance(first, InputRequiredResult)
    schema = form_schema(first, "meeting")
    assert shapes(schema) == {
        "string",
        "string length bounds",
        "string format email",
        "string format uri",
        "string format date",
        "string format date-time",
        "number with bounds",
        "integer with bounds",
        "boolean with default",
        "untitled single-select",
        "titled single-select",
        "legacy enumNames",
        "untitled multi-select",
        "titled multi-select",
    }
    properties = schema["properties"].values()
    assert sum("default" in prop for prop in properties) >= 5
    assert all("title" in prop for prop in properties)
    assert sum("description" in prop for prop in properties) >= 3
    assert set(schema["required"]) <= set(schema["properties"])


@pytest.mark.anyio
async def test_schedule_meeting_returns_exactly_the_accepted_content(url: str) -> None:
    done = await call(url, "schedule_meeting", {}, {"meeting": accept(**MEETING)})

    assert isinstance(done, CallToolResult) and not done.is_error
    assert done.structured_content == MEETING
    assert json.loads(text_of(done)) == MEETING
    assert type(done.structured_content["attendees"]) is int
    assert type(done.structured_content["duration_hours"]) is float


@pytest.mark.anyio
async def test_schedule_meeting_asks_again_when_the_content_breaks_the_schema(url: str) -> None:
    wrong = {**MEETING, "organizer_email": "not an email"}

    again = await call(url, "schedule_meeting", {}, {"meeting": accept(**wrong)})

    assert isinstance(again, InputRequiredResult)
    assert "organizer_email" in elicitation(again, "meeting").message
    assert executions(url) == {}


@pytest.mark.anyio
async def test_connect_account_sends_the_reviewer_to_an_https_page(url: str) -> None:
    first = await call(url, "connect_account", {"service": "GitHub"})

    assert isinstance(first, InputRequiredResult)
    params = elicitation(first, "sign_in")
    assert isinstance(params, ElicitRequestURLParams) and params.mode == "url"
    assert urlsplit(params.url).scheme == "https"
    assert urlsplit(params.url).hostname == "accounts.example.com"
    assert "GitHub" in params.message

    done = await call(
        url,
        "connect_account",
        {"service": "GitHub"},
        {"sign_in": ElicitResult(action="accept")},
        first.request_state,
    )
    assert isinstance(done, CallToolResult) and text_of(done) == "Connected GitHub"

    # A new call: the first one ended, and its state is not taken again (a replay).
    again = await call(url, "connect_account", {"service": "GitHub"})
    assert isinstance(again, InputRequiredResult)
    declined = await call(
        url,
        "connect_account",
        {"service": "GitHub"},
        {"sign_in": ElicitResult(action="decline")},
        again.request_state,
    )
    assert isinstance(declined, CallToolResult) and declined.is_error
    assert "declined by the reviewer" in text_of(declined)


@pytest.mark.anyio
async def test_echo_returns_its_text_and_fail_is_a_tool_error(url: str) -> None:
    echoed = await call(url, "echo", {"text": "héllo"})
    failed = await call(url, "fail", {})

    assert isinstance(echoed, CallToolResult) and text_of(echoed) == "héllo" and not echoed.is_error
    assert isinstance(failed, CallToolResult) and failed.is_error
    assert executions(url) == {"echo": 1}


# --- raw HTTP: capabilities and Idempotency-Key ----------------------------------------------------


def raw_call(
    request_id: int,
    tool: str,
    arguments: dict[str, Any],
    capabilities: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and body of a tools/call as the SDK client sends them (see the recorded-requests test)."""
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": tool,
    }
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "demo-tests", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities
        or {"elicitation": {"form": {}, "url": {}}},
    }
    params = {"name": tool, "arguments": arguments, **extra, "_meta": meta}
    return headers, {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def post(url: str, body: dict[str, Any], headers: dict[str, str], key: str | None = None) -> httpx.Response:
    extra = {"idempotency-key": key} if key else {}
    return httpx.post(url, json=body, headers={**headers, **extra}, timeout=30)


def staging_retry(state: str | None, request_id: int) -> tuple[dict[str, str], dict[str, Any]]:
    answers = {"environment": {"action": "accept", "content": {"environment": "staging"}}}
    return raw_call(
        request_id, "create_deployment", {"branch": BRANCH}, inputResponses=answers, requestState=state
    )


@pytest.mark.anyio
async def test_an_undeclared_elicitation_mode_is_refused_with_32021(url: str) -> None:
    headers, body = raw_call(1, "connect_account", {"service": "GitHub"}, capabilities={"elicitation": {}})

    response = post(url, body, headers)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32021
    assert error["data"]["requiredCapabilities"] == {"elicitation": {"url": {}}}


@pytest.mark.anyio
async def test_the_same_idempotency_key_replays_the_first_answer_without_running_again(url: str) -> None:
    first = await ask_environment(url)
    headers, body = staging_retry(first.request_state, 7)

    original = post(url, body, headers, key="round-1-of-call-42")
    replayed = post(url, body, headers, key="round-1-of-call-42")
    _, renumbered = staging_retry(first.request_state, 8)
    readdressed = post(url, renumbered, headers, key="round-1-of-call-42")

    assert original.status_code == replayed.status_code == 200
    assert replayed.json() == original.json()
    assert original.json()["result"]["content"][0]["text"] == f"Deployed {BRANCH} to staging"
    assert replayed.headers["idempotent-replayed"] == "true"
    assert readdressed.json()["id"] == 8
    assert readdressed.json()["result"] == original.json()["result"]
    assert executions(url) == {"create_deployment": 1}


@pytest.mark.anyio
async def test_an_idempotency_key_reused_for_another_request_is_refused(url: str) -> None:
    first = await ask_environment(url)
    headers, body = staging_retry(first.request_state, 1)
    post(url, body, headers, key="shared-key")
    other_headers, other = raw_call(2, "echo", {"text": "hi"})

    conflict = post(url, other, other_headers, key="shared-key")

    assert conflict.status_code == 422
    assert conflict.json()["error"]["code"] == -32602
    assert executions(url) == {"create_deployment": 1}


@pytest.mark.anyio
async def test_a_repeat_arriving_while_the_first_is_in_flight_waits_for_its_answer(url: str) -> None:
    first = await ask_environment(url)
    headers, body = staging_retry(first.request_state, 1)
    headers = {**headers, "idempotency-key": "in-flight"}
    hold(url, "create_deployment", "after", 2.0)
    # Keyed by the order sent: the replay is woken by the first's answer, so it may finish first.
    responses: dict[int, httpx.Response] = {}

    async def send(order: int) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            responses[order] = await client.post(url, json=body, headers=headers)

    def keyed_requests() -> int:
        return sum("idempotency-key" in r["headers"] for r in recorded_requests(url))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(send, 0)
        await anyio.to_thread.run_sync(wait_for_held, url)
        tasks.start_soon(send, 1)
        while keyed_requests() < 2:
            await anyio.sleep(0.02)
        assert inflight(url)["held"] == 1, "the repeat should arrive while the first is still held"

    assert responses[0].json() == responses[1].json()
    assert "idempotent-replayed" not in responses[0].headers
    assert responses[1].headers["idempotent-replayed"] == "true"
    assert executions(url) == {"create_deployment": 1}


# --- test hooks -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_recorded_requests_show_exactly_what_the_sdk_sent_on_the_retry(url: str) -> None:
    async with session(url) as s:
        first = await s.call_tool("create_deployment", {"branch": BRANCH}, allow_input_required=True)
        assert isinstance(first, InputRequiredResult)
        answers: InputResponses = {"environment": accept(environment="staging")}
        await s.call_tool(
            "create_deployment",
            {"branch": BRANCH},
            input_responses=answers,
            request_state=first.request_state,
            allow_input_required=True,
        )

    calls = [r for r in recorded_requests(url) if r["body"]["method"] == "tools/call"]

    assert len(calls) == 2
    retry = calls[1]
    assert retry["body"]["id"] != calls[0]["body"]["id"]
    assert retry["body"]["params"]["inputResponses"] == {
        "environment": {"action": "accept", "content": {"environment": "staging"}}
    }
    assert retry["body"]["params"]["requestState"] == first.request_state
    assert retry["body"]["params"]["arguments"] == {"branch": BRANCH}
    meta = retry["body"]["params"]["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientCapabilities"] == {"elicitation": {"form": {}, "url": {}}}
    assert retry["headers"]["mcp-method"] == "tools/call"
    assert retry["headers"]["mcp-name"] == "create_deployment"
    assert retry["headers"]["mcp-protocol-version"] == "2026-07-28"
    assert retry["headers"]["accept"] == "application/json, text/event-stream"
    assert "idempotency-key" not in retry["headers"]


@pytest.mark.anyio
async def test_hold_after_keeps_the_answer_back_although_the_tool_already_ran(url: str) -> None:
    first = await ask_environment(url)
    hold(url, "create_deployment", "after", 30)
    finished: list[float] = []

    async def retry() -> None:
        await retry_deployment(url, first.request_state, environment=accept(environment="staging"))
        finished.append(time.monotonic())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(retry)
        state = await anyio.to_thread.run_sync(wait_for_held, url)
        assert state["phase"] == "after"
        assert executions(url) == {"create_deployment": 1}
        assert not finished
        released_at = time.monotonic()
        reset(url)  # releases the held request

    assert finished and finished[0] - released_at < 5
    assert inflight(url)["held"] == 0


@pytest.mark.anyio
async def test_hold_before_keeps_the_tool_from_running(url: str) -> None:
    first = await ask_environment(url)
    hold(url, "create_deployment", "before", 30)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(
            lambda: retry_deployment(url, first.request_state, environment=accept(environment="staging"))
        )
        state = await anyio.to_thread.run_sync(wait_for_held, url)
        assert state["phase"] == "before"
        assert executions(url) == {}
        reset(url)

    assert executions(url) == {"create_deployment": 1}


# --- the process ----------------------------------------------------------------------------------


def test_the_cli_logs_its_url_and_stops_cleanly_on_sigterm() -> None:
    with DemoServer(test_hooks=False) as server:
        process = server.process
        assert process is not None
        assert httpx.get(f"{server.base_url}/test-hooks/executions").status_code == 404

        started = time.monotonic()
        server.stop()

        assert time.monotonic() - started < 5
        assert process.returncode in (0, -15)
        assert f"listening on {server.url}" in server.log()


@pytest.mark.anyio
async def test_a_client_killed_during_a_hold_leaves_its_answer_for_the_same_key(url: str) -> None:
    first = await ask_environment(url)
    headers, body = staging_retry(first.request_state, 1)
    headers = {**headers, "idempotency-key": "killed-client"}
    hold(url, "create_deployment", "before", 1.0)
    sender = (
        "import httpx, json, sys; "
        "httpx.post(sys.argv[1], json=json.loads(sys.argv[2]), headers=json.loads(sys.argv[3]), timeout=30)"
    )
    client = subprocess.Popen([sys.executable, "-c", sender, url, json.dumps(body), json.dumps(headers)])
    try:
        await anyio.to_thread.run_sync(wait_for_held, url)
    finally:
        client.kill()
        client.wait()

    again = post(url, body, headers)

    assert again.json()["result"]["content"][0]["text"] == f"Deployed {BRANCH} to staging"
    assert again.headers["idempotent-replayed"] == "true"
    assert executions(url) == {"create_deployment": 1}
