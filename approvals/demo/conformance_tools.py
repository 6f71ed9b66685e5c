"""The tools and prompt the official conformance suite's `input-required-result-*` server scenarios call
(plus `test_missing_capability`, which its `server-stateless` scenario probes).

Names, keys, messages and schemas follow the scenario descriptions of
`@modelcontextprotocol/conformance` 0.2.0-alpha.12, so the demo server can be checked with

    conformance server --url http://127.0.0.1:PORT/mcp --spec-version 2026-07-28 \
        --scenario input-required-result-basic-elicitation
"""

from __future__ import annotations

import secrets
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Message, UserMessage
from mcp_types import (
    CallToolResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    SamplingMessage,
    TextContent,
)

from approvals.demo import rounds
from approvals.demo.eras import dual_era


def _string_form(field: str) -> dict[str, Any]:
    return {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}


NAME_SCHEMA = _string_form("name")
COLOR_SCHEMA = _string_form("color")
CONTEXT_SCHEMA = _string_form("context")
OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _sampling(text: str, max_tokens: int) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return CreateMessageRequest(params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens))


def _sampled_text(answer: Any) -> str | None:
    if isinstance(answer, CreateMessageResult) and isinstance(answer.content, TextContent):
        return answer.content.text
    return None


def _root_uris(answer: Any) -> list[str] | None:
    return [str(root.uri) for root in answer.roots] if isinstance(answer, ListRootsResult) else None


async def test_input_required_result_elicitation(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: one form asking for a name, then a greeting."""
    answer = rounds.reply(ctx, "user_name", NAME_SCHEMA)
    if answer.refused:
        return rounds.refusal(answer, "The greeting")
    if answer.content is None:
        return rounds.ask(ctx, {"user_name": rounds.form("What is your name?", NAME_SCHEMA)})
    return rounds.result(f"Hello, {answer.content['name']}!")


async def test_input_required_result_sampling(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: one sampling request."""
    text = _sampled_text(rounds.response(ctx, "capital_question"))
    if text is None:
        return rounds.ask(ctx, {"capital_question": _sampling("What is the capital of France?", 100)})
    return rounds.result(f"Sampling answered: {text}")


async def test_input_required_result_list_roots(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: one roots/list request."""
    uris = _root_uris(rounds.response(ctx, "client_roots"))
    if uris is None:
        return rounds.ask(ctx, {"client_roots": ListRootsRequest()})
    return rounds.result(f"Roots: {', '.join(uris) or '(none)'}")


async def test_input_required_result_request_state(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: a form plus a requestState that must come back for the call to complete."""
    minted = rounds.state(ctx).get("nonce")
    answer = rounds.reply(ctx, "confirm", OK_SCHEMA)
    if minted and answer.accepted:
        return rounds.result(f"state-ok: request state {minted} verified.")
    request = rounds.form("Please confirm", OK_SCHEMA)
    return rounds.ask(ctx, {"confirm": request}, {"nonce": secrets.token_hex(4)})


async def test_input_required_result_multiple_inputs(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: a form, a sampling and a roots request in one round; answered ones are kept in the state."""
    gathered: dict[str, Any] = rounds.state(ctx).get("gathered", {})
    name = rounds.reply(ctx, "user_name", NAME_SCHEMA)
    if name.content is not None:
        gathered["user_name"] = name.content["name"]
    if (greeting := _sampled_text(rounds.response(ctx, "greeting"))) is not None:
        gathered["greeting"] = greeting
    if (uris := _root_uris(rounds.response(ctx, "client_roots"))) is not None:
        gathered["client_roots"] = uris
    wanted: dict[str, InputRequest] = {
        "user_name": rounds.form("What is your name?", NAME_SCHEMA),
        "greeting": _sampling("Generate a greeting", 50),
        "client_roots": ListRootsRequest(),
    }
    missing = {key: request for key, request in wanted.items() if key not in gathered}
    if missing:
        return rounds.ask(ctx, missing, {"gathered": gathered})
    return rounds.result(
        f"Every input answered: {gathered['greeting']} {gathered['user_name']} "
        f"({len(gathered['client_roots'])} roots)."
    )


async def test_input_required_result_multi_round(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: two rounds in a row, each with its own state."""
    state = rounds.state(ctx)
    if state.get("round") == 2:
        color = rounds.reply(ctx, "step2", COLOR_SCHEMA)
        if color.content is not None:
            return rounds.result(f"{state['name']} likes {color.content['color']}. Both rounds answered.")
        request = rounds.form("Step 2: What is your favorite color?", COLOR_SCHEMA)
        return rounds.ask(ctx, {"step2": request}, state)
    name = rounds.reply(ctx, "step1", NAME_SCHEMA)
    if name.content is not None:
        request = rounds.form("Step 2: What is your favorite color?", COLOR_SCHEMA)
        return rounds.ask(ctx, {"step2": request}, {"round": 2, "name": name.content["name"]})
    return rounds.ask(ctx, {"step1": rounds.form("Step 1: What is your name?", NAME_SCHEMA)}, {"round": 1})


async def test_input_required_result_tampered_state(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: a sealed state; a tampered one is refused by the SDK before this body runs."""
    answer = rounds.reply(ctx, "confirm", OK_SCHEMA)
    if rounds.state(ctx).get("check") == "tamper-test" and answer.accepted:
        return rounds.result("Request state verified; the call is complete.")
    return rounds.ask(ctx, {"confirm": rounds.form("Please confirm", OK_SCHEMA)}, {"check": "tamper-test"})


async def test_input_required_result_capabilities(ctx: Context) -> CallToolResult | InputRequiredResult:
    """MRTR: asks only for what the request's clientCapabilities declare."""
    caps = rounds.declared(ctx)
    offered: dict[str, InputRequest] = {}
    if caps.elicitation is not None:
        offered["user_name"] = rounds.form("What is your name?", NAME_SCHEMA)
    if caps.sampling is not None:
        offered["capital_question"] = _sampling("What is the capital of France?", 100)
    if caps.roots is not None:
        offered["client_roots"] = ListRootsRequest()
    if not offered:
        return rounds.result("No input capability declared: nothing to ask.")
    if any(key in rounds.responses(ctx) for key in offered):
        return rounds.result("Declared-capability input answered.")
    return rounds.ask(ctx, offered)


async def test_input_required_result_prompt(ctx: Context) -> list[Message] | InputRequiredResult:
    """MRTR on prompts/get: asks for the context the prompt should use."""
    answer = rounds.reply(ctx, "user_context", CONTEXT_SCHEMA)
    if answer.content is None:
        request = rounds.form("What context should the prompt use?", CONTEXT_SCHEMA)
        return rounds.ask(ctx, {"user_context": request})
    return [UserMessage(f"Answer with this context in mind: {answer.content['context']}")]


TOOLS = (
    test_input_required_result_elicitation,
    test_input_required_result_sampling,
    test_input_required_result_list_roots,
    test_input_required_result_request_state,
    test_input_required_result_multiple_inputs,
    test_input_required_result_multi_round,
    test_input_required_result_tampered_state,
    test_input_required_result_capabilities,
)


def register(mcp: MCPServer) -> None:
    for tool in TOOLS:
        mcp.add_tool(dual_era(tool))
    # server-stateless probes a tool that needs sampling, expecting -32021 when it is undeclared.
    mcp.add_tool(dual_era(test_input_required_result_sampling), name="test_missing_capability")
    mcp.prompt(name=test_input_required_result_prompt.__name__)(dual_era(test_input_required_result_prompt))
