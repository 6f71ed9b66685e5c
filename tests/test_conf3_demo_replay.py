"""The demo MCP server refuses a `requestState` of a call that already ended: a copied state must not run a
tool a second time, nor reopen a call a reviewer refused. Driven over real HTTP by the official SDK client."""

from __future__ import annotations

from typing import Any

import anyio
import mcp
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, ElicitResult, InputRequiredResult

from tests.demo_support import executions

BRANCH = "feature/replay"


def call(
    url: str, tool: str, arguments: dict[str, Any], state: str | None = None, **answers: ElicitResult
) -> CallToolResult | InputRequiredResult:
    async def run() -> CallToolResult | InputRequiredResult | MCPError:
        async def never(context: Any, params: Any) -> ElicitResult:
            raise AssertionError("the session layer hands input_required back")

        async with mcp.Client(url, mode="2026-07-28", elicitation_callback=never) as client:
            await client.list_tools()
            try:
                return await client.session.call_tool(
                    tool,
                    arguments,
                    input_responses=dict(answers) or None,
                    request_state=state,
                    allow_input_required=True,
                )
            except MCPError as error:  # raised out of the `async with`, it would arrive in an ExceptionGroup
                return error

    outcome = anyio.run(run)
    if isinstance(outcome, MCPError):
        raise outcome
    return outcome


def accept(**content: Any) -> ElicitResult:
    return ElicitResult(action="accept", content=content)


def refused_as_invalid_state(url: str, *args: Any, **answers: ElicitResult) -> MCPError:
    with pytest.raises(MCPError) as refused:
        call(url, *args, **answers)
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.data == {"reason": "invalid_request_state"}
    return refused.value


def to_production_confirmation(url: str) -> tuple[InputRequiredResult, InputRequiredResult]:
    first = call(url, "create_deployment", {"branch": BRANCH})
    assert isinstance(first, InputRequiredResult)
    second = call(
        url,
        "create_deployment",
        {"branch": BRANCH},
        first.request_state,
        environment=accept(environment="production"),
    )
    assert isinstance(second, InputRequiredResult) and set(second.input_requests or {}) == {"confirm"}
    return first, second


def test_a_replayed_final_round_does_not_deploy_a_second_time(url: str) -> None:
    _, second = to_production_confirmation(url)
    done = call(
        url, "create_deployment", {"branch": BRANCH}, second.request_state, confirm=accept(confirm=True)
    )
    assert isinstance(done, CallToolResult) and not done.is_error

    refused_as_invalid_state(
        url, "create_deployment", {"branch": BRANCH}, second.request_state, confirm=accept(confirm=True)
    )

    assert executions(url) == {"create_deployment": 1}


def test_an_earlier_round_of_a_declined_call_cannot_deploy_after_all(url: str) -> None:
    first, second = to_production_confirmation(url)
    declined = call(
        url,
        "create_deployment",
        {"branch": BRANCH},
        second.request_state,
        confirm=ElicitResult(action="decline"),
    )
    assert isinstance(declined, CallToolResult) and declined.is_error

    # The first round's state, answered anew: the call it belongs to has ended.
    refused_as_invalid_state(
        url,
        "create_deployment",
        {"branch": BRANCH},
        first.request_state,
        environment=accept(environment="staging"),
    )

    assert executions(url) == {}


def test_a_round_asked_again_keeps_its_call_open_and_separate_calls_stay_apart(url: str) -> None:
    first = call(url, "create_deployment", {"branch": BRANCH})
    other = call(url, "create_deployment", {"branch": BRANCH})
    assert isinstance(first, InputRequiredResult) and isinstance(other, InputRequiredResult)

    again = call(
        url,
        "create_deployment",
        {"branch": BRANCH},
        first.request_state,
        environment=accept(environment="qa"),
    )
    assert isinstance(again, InputRequiredResult)  # an unusable answer is asked again, nothing ended
    done = call(
        url,
        "create_deployment",
        {"branch": BRANCH},
        again.request_state,
        environment=accept(environment="staging"),
    )
    assert isinstance(done, CallToolResult) and not done.is_error
    # Another call of the same tool and arguments has its own state, untouched by the first call's end.
    also = call(
        url,
        "create_deployment",
        {"branch": BRANCH},
        other.request_state,
        environment=accept(environment="staging"),
    )

    assert isinstance(also, CallToolResult) and not also.is_error
    assert executions(url) == {"create_deployment": 2}
