"""Pass-through on `/mcp`: a rule says the requester answers, so the upstream's question goes to the agent's
own MCP client instead of the reviewers' queue. Real parts: the gateway process, PostgreSQL, Redis, a
Celery worker, the demo MCP server and the official Python SDK client in both eras."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import mcp
import mcp_types as types
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from approvals.models import AuditEvent, InputRequest, McpServer, Round, RoutingRule, ToolCall
from approvals.services import servers, tokens
from tests import demo_support
from tests import test_gateway as gateway_tests
from tests.live import HolderRunner, child_env, wait_until
from tests.test_gateway import GatewayHub, _text, call_in_background
from tests.test_session import PushServer

# The gateway tests' fixtures: one gateway process for this module, a fresh hub for each test.
gateway_process = gateway_tests.gateway_process
gateway = gateway_tests.gateway
ghub = gateway_tests.ghub

pytestmark = pytest.mark.timeout(180)

TOOL = "demo__create_deployment"


def _requester_rule(ghub: GatewayHub, slug: str = "demo", tools: str = "create_deployment") -> RoutingRule:
    return RoutingRule.objects.create(
        name="the requester picks",
        server=McpServer.objects.get(slug=slug),
        tool_pattern=tools,
        team=ghub.hub.server.default_team,
        answered_by=RoutingRule.AnsweredBy.REQUESTER,
    )


def _connect(url: str, token: str, mode: str, elicit: Any = None) -> tuple[httpx2.AsyncClient, mcp.Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60))
    transport = streamable_http_client(url, http_client=http)
    if elicit is None:
        return http, mcp.Client(transport, mode=mode)  # type: ignore[arg-type]
    return http, mcp.Client(transport, mode=mode, elicitation_callback=elicit)  # type: ignore[arg-type]


async def _never(context: Any, params: Any) -> types.ElicitResult:
    raise AssertionError("a 2026-07-28 client is never sent elicitation/create")


def _upstream_answers(demo_url: str) -> list[dict[str, Any]]:
    """The inputResponses of every tools/call retry the demo server received."""
    return [
        r["body"]["params"]["inputResponses"]
        for r in demo_support.recorded_requests(demo_url)
        if r["body"].get("method") == "tools/call" and "inputResponses" in r["body"].get("params", {})
    ]


def test_a_2026_client_gets_input_required_answers_and_gets_the_result(ghub: GatewayHub, demo_server) -> None:
    _requester_rule(ghub)

    async def run() -> tuple[types.InputRequiredResult, types.CallToolResult, list[str]]:
        http, client = _connect(ghub.url + "/mcp", ghub.token, "2026-07-28", _never)
        async with http, client:
            await client.list_tools()
            first = await client.session.call_tool(TOOL, {"branch": "pt"}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult), first
            assert first.request_state is not None
            refusals = []
            # Tampered, or replayed with other arguments: refused with a clear error, nothing recorded.
            tampered = first.request_state[:-4] + (
                "AAAA" if not first.request_state.endswith("AAAA") else "BBBB"
            )
            for name, arguments, state in [
                (TOOL, {"branch": "pt"}, tampered),
                (TOOL, {"branch": "other"}, first.request_state),
                (TOOL, {"branch": "pt"}, "v1.not-a-state"),
            ]:
                with pytest.raises(MCPError) as refused:
                    await client.session.call_tool(
                        name,
                        arguments,
                        input_responses={
                            "environment": types.ElicitResult(
                                action="accept", content={"environment": "staging"}
                            )
                        },
                        request_state=state,
                        allow_input_required=True,
                    )
                refusals.append(f"{refused.value.error.code}: {refused.value.error.message}")
            # An answer the schema refuses is refused with the reason; the question stays open.
            with pytest.raises(MCPError) as invalid:
                await client.session.call_tool(
                    TOOL,
                    {"branch": "pt"},
                    input_responses={
                        "environment": types.ElicitResult(action="accept", content={"environment": "moon"})
                    },
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            refusals.append(f"{invalid.value.error.code}: {invalid.value.error.message}")
            done = await client.session.call_tool(
                TOOL,
                {"branch": "pt"},
                input_responses={
                    "environment": types.ElicitResult(action="accept", content={"environment": "staging"})
                },
                request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(done, types.CallToolResult), done
            return first, done, refusals

    first, done, refusals = anyio.run(run)

    # The question is the upstream's, under its key; the state is the hub's own, not the upstream's.
    assert first.input_requests is not None and list(first.input_requests) == ["environment"]
    asked = first.input_requests["environment"]
    assert isinstance(asked, types.ElicitRequest)
    assert "Which environment should pt be deployed to?" in asked.params.message
    call = ToolCall.objects.get()
    # The upstream's state, as the hub echoed it on its retry (the round forgot it once the server answered).
    upstream_state = next(
        r["body"]["params"]["requestState"]
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and "requestState" in r["body"].get("params", {})
    )
    assert upstream_state and first.request_state != upstream_state
    assert upstream_state not in (first.request_state or "")
    assert not Round.objects.filter(call=call, request_state__isnull=False).exists()
    # Never in the reviewers' queue.
    assert not [i for i in ghub.hub.reviewer.inbox() if i["call"] == str(call.pk)]

    assert all(r.startswith(f"{types.INVALID_PARAMS}:") for r in refusals), refusals
    assert "Invalid or expired requestState" in refusals[0]
    assert "Invalid or expired requestState" in refusals[1]
    assert "environment" in refusals[3] and "requested schema" in refusals[3]

    assert done.is_error is False and "Deployed pt to staging" in _text(done)
    call.refresh_from_db()
    assert call.status == "completed"
    # The upstream received exactly the person's answer, once.
    assert _upstream_answers(demo_server.url) == [
        {"environment": {"action": "accept", "content": {"environment": "staging"}}}
    ]
    assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    # The audit shows the routing and the answer, by the agent, for its person.
    routed = AuditEvent.objects.get(call_id=call.pk, verb="input.routed")
    assert routed.data["answered_by"] == "requester"
    answered = AuditEvent.objects.get(call_id=call.pk, verb="input.answered")
    assert answered.actor_type == "agent" and answered.actor_label == "ci-agent"
    assert (
        answered.data["content"] == {"environment": "staging"} and answered.data["answered_by"] == "requester"
    )
    assert answered.data["channel"] == "mcp"


def test_a_foreign_agent_cannot_use_anothers_request_state(ghub: GatewayHub) -> None:
    _requester_rule(ghub)
    _, other_token = tokens.agent_create(name="other-agent", servers=[ghub.hub.server])

    async def run() -> MCPError:
        http, client = _connect(ghub.url + "/mcp", ghub.token, "2026-07-28", _never)
        async with http, client:
            first = await client.session.call_tool(TOOL, {"branch": "mine"}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult)
        http, thief = _connect(ghub.url + "/mcp", other_token, "2026-07-28", _never)
        async with http, thief:
            with pytest.raises(MCPError) as refused:
                await thief.session.call_tool(
                    TOOL,
                    {"branch": "mine"},
                    input_responses={
                        "environment": types.ElicitResult(action="accept", content={"environment": "staging"})
                    },
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            return refused.value

    refused = anyio.run(run)
    assert refused.error.code == types.INVALID_PARAMS
    assert "requestState" in refused.error.message
    assert InputRequest.objects.get().status == InputRequest.Status.PENDING


@pytest.mark.parametrize("action", ["accept", "decline"])
def test_a_handshake_client_is_sent_elicitation_create_and_its_answer_reaches_the_upstream(
    ghub: GatewayHub, demo_server, action: str
) -> None:
    _requester_rule(ghub)
    asked: list[types.ElicitRequestParams] = []

    async def person(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        if action == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"environment": "staging"})

    async def run() -> types.CallToolResult:
        http, client = _connect(ghub.url + "/mcp", ghub.token, "legacy", person)
        async with http, client:
            await client.list_tools()
            return await client.call_tool(TOOL, {"branch": "hs"})

    result = anyio.run(run)
    assert len(asked) == 1 and "Which environment should hs be deployed to?" in asked[0].message
    call = ToolCall.objects.get()
    expected: dict[str, Any] = {"action": action}
    if action == "accept":
        expected["content"] = {"environment": "staging"}
        assert result.is_error is False and "Deployed hs to staging" in _text(result)
        assert demo_support.executions(demo_server.url).get("create_deployment") == 1
    else:
        assert result.is_error is True
        assert demo_support.executions(demo_server.url).get("create_deployment", 0) == 0
    assert _upstream_answers(demo_server.url) == [{"environment": expected}]
    answered = AuditEvent.objects.get(call_id=call.pk, verb="input.answered")
    assert answered.actor_type == "agent" and answered.data["action"] == action
    assert call.agent_client == {"era": "handshake", "modes": ["form", "url"]}


def test_a_client_without_the_capability_leaves_the_question_to_the_team(ghub: GatewayHub) -> None:
    _requester_rule(ghub)

    async def run() -> types.CallToolResult | types.InputRequiredResult:
        http, client = _connect(ghub.url + "/mcp", ghub.token, "2026-07-28")
        async with http, client:
            return await client.session.call_tool(TOOL, {"branch": "team"}, allow_input_required=True)

    async def answer_as_reviewer() -> None:
        def pending() -> str | None:
            return next((i["id"] for i in ghub.hub.reviewer.inbox() if i["key"] == "environment"), None)

        while (found := await anyio.to_thread.run_sync(pending)) is None:
            await anyio.sleep(0.1)
        await anyio.to_thread.run_sync(
            lambda: ghub.hub.reviewer.respond(found, "accept", {"environment": "staging"})
        )

    async def both() -> types.CallToolResult | types.InputRequiredResult:
        async with anyio.create_task_group() as group:
            group.start_soon(answer_as_reviewer)
            return await run()

    result = anyio.run(both)
    assert isinstance(result, types.CallToolResult) and "Deployed team to staging" in _text(result)
    ir = InputRequest.objects.get()
    assert ir.for_requester is False and ir.answered_by == ghub.hub.reviewer_user
    routed = AuditEvent.objects.get(call_id=ir.round.call_id, verb="input.routed")
    assert routed.data["answered_by"] == "team"
    assert "did not declare the elicitation capability" in routed.data["passthrough_refused"]


# --- a handshake-era upstream that pushes elicitation/create (through the holder) -------------------------


@pytest.fixture(scope="module")
def push() -> Iterator[PushServer]:
    server = PushServer(wait=30)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pushy(ghub: GatewayHub, push: PushServer) -> Iterator[GatewayHub]:
    server = McpServer.objects.create(
        slug="pushy",
        name="Push bot",
        url=push.url,
        era=McpServer.Era.HANDSHAKE,
        elicitation_wait=30,
        default_team=ghub.hub.server.default_team,
    )
    servers.server_refresh_tools(server=server)
    ghub.hub.server.agents.get().servers.add(server)
    holder = HolderRunner(child_env(ELICIT_HOLDER_POLL="1", ELICIT_HOLDER_HEARTBEAT="1")).start()
    try:
        yield ghub
    finally:
        holder.stop()


def test_a_pushed_url_sign_in_reaches_a_handshake_client_and_its_answer_the_server(
    pushy: GatewayHub, push: PushServer
) -> None:
    _requester_rule(pushy, "pushy", "*")
    asked: list[types.ElicitRequestURLParams] = []

    async def person(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept")

    async def run() -> types.CallToolResult:
        http, client = _connect(pushy.url + "/mcp", pushy.token, "legacy", person)
        async with http, client:
            return await client.call_tool("pushy__ask_url", {})

    before = push.counts().get("ask_url", 0)
    result = anyio.run(run)
    assert len(asked) == 1 and isinstance(asked[0], types.ElicitRequestURLParams)
    assert asked[0].url == "https://example.com/sign-in" and asked[0].elicitation_id
    assert _text(result) == "url accept"
    assert push.counts()["ask_url"] == before + 1
    rnd = Round.objects.get(call__tool="ask_url")
    assert rnd.kind == Round.Kind.PUSH and rnd.input_requests.get().for_requester


def test_a_pushed_question_reaches_a_2026_client_as_input_required(
    pushy: GatewayHub, push: PushServer
) -> None:
    _requester_rule(pushy, "pushy", "*")

    async def run() -> tuple[types.InputRequiredResult, types.CallToolResult]:
        http, client = _connect(pushy.url + "/mcp", pushy.token, "2026-07-28", _never)
        async with http, client:
            first = await client.session.call_tool(
                "pushy__ask", {"question": "Which branch?"}, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult), first
            assert first.input_requests is not None
            (key,) = first.input_requests
            done = await client.session.call_tool(
                "pushy__ask",
                {"question": "Which branch?"},
                input_responses={key: types.ElicitResult(action="accept", content={"text": "release-7"})},
                request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(done, types.CallToolResult), done
            return first, done

    first, done = anyio.run(run)
    asked = next(iter(first.input_requests.values()))  # type: ignore[union-attr]
    assert isinstance(asked, types.ElicitRequest) and asked.params.message == "Which branch?"
    assert _text(done) == "accepted: release-7"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_without_a_requester_rule_a_pushed_question_reaches_the_reviewers_as_through_rest(
    pushy: GatewayHub, push: PushServer, mode: str
) -> None:
    """The upstream's elicitation/create, for a call made through /mcp, is in the team's inbox like one made
    through the REST API; the reviewer's answer reaches the server and the client gets its result."""
    outcome, thread = call_in_background(
        pushy.url + "/mcp", pushy.token, mode, "pushy__ask", {"question": "Which tag?"}
    )
    call_id = wait_until(
        lambda: ToolCall.objects.filter(tool="ask").values_list("pk", flat=True).first(),
        30,
        0.1,
        what="the gateway's call",
    )
    item = pushy.hub.reviewer.wait_for_request(str(call_id), "elicitation")
    assert item["message"] == "Which tag?" and item["team"] == "release" and item["server"] == "pushy"
    assert item["server_deadline"] is not None
    wait_until(
        lambda: any("waiting for release" in (m or "") for _, m in outcome.progress),
        30,
        0.1,
        what="progress naming the team",
    )
    assert pushy.hub.reviewer.respond(item["id"], "accept", {"text": "v7"}).status_code == 200
    thread.join(60)
    assert outcome.error is None, repr(outcome.error)
    assert outcome.result is not None and _text(outcome.result) == "accepted: v7"
    assert Round.objects.get(call__tool="ask").kind == Round.Kind.PUSH
