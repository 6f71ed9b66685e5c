"""The demo's tools on both protocol eras.

The tools are written for 2026-07-28: each round ends with `input_required` and the client retries. A
handshake-era client (2025-06-18, 2025-11-25) never retries: it expects `elicitation/create` (or
`sampling/createMessage`, `roots/list`) in the middle of its `tools/call`, on its session. `dual_era`
runs the same rounds inside that one call: it sends each input request over the session, waits for the
client's answer, and runs the tool again with the answers and the state it kept, until a final result.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    INTERNAL_ERROR,
    CreateMessageRequest,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequest,
    InputRequiredResult,
    InputResponse,
    ListRootsRequest,
    ListRootsResult,
)
from mcp_types.version import is_version_at_least

from approvals.demo import rounds

# A client that keeps sending unusable answers is asked again, but not for ever.
MAX_ROUNDS = 20
MODERN = "2026-07-28"

P = ParamSpec("P")
R = TypeVar("R")


def dual_era(tool: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """`tool` (which takes `ctx: Context`) served on both eras; its signature is kept for the SDK."""

    @functools.wraps(tool)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = kwargs.get("ctx")
        if not isinstance(ctx, Context) or is_version_at_least(ctx.protocol_version or MODERN, MODERN):
            return await tool(*args, **kwargs)
        return await _over_the_session(tool, ctx, args, kwargs)

    return run


async def _over_the_session(tool: Callable[..., Awaitable[R]], ctx: Context, args: Any, kwargs: Any) -> R:
    held = rounds.HandshakeRound(input_responses=None, request_state=None)
    for _ in range(MAX_ROUNDS):
        token = rounds.handshake_round.set(held)
        try:
            result = await tool(*args, **kwargs)
        finally:
            rounds.handshake_round.reset(token)
        if not isinstance(result, InputRequiredResult):
            return result
        answers = {key: await _ask(ctx, request) for key, request in (result.input_requests or {}).items()}
        # The state never leaves the server on this era: it is kept here, unsealed, for the next round.
        held = rounds.HandshakeRound(input_responses=answers, request_state=result.request_state)
    raise MCPError(code=INTERNAL_ERROR, message=f"No usable answer after {MAX_ROUNDS} requests")


async def _ask(ctx: Context, request: InputRequest) -> InputResponse:
    """Send one input request to the client, related to the call in progress, and return its answer."""
    related = ServerMessageMetadata(related_request_id=ctx.request_id)
    session = ctx.session
    if isinstance(request, ElicitRequest):
        params = request.params
        if isinstance(params, ElicitRequestURLParams) and params.elicitation_id is None:
            # 2025-11-25 requires an id on a URL-mode request; 2026-07-28 dropped it.
            params = params.model_copy(update={"elicitation_id": secrets.token_urlsafe(9)})
        return await session.send_request(ElicitRequest(params=params), ElicitResult, metadata=related)
    if isinstance(request, CreateMessageRequest):
        return await session.send_request(request, CreateMessageResult, metadata=related)
    if isinstance(request, ListRootsRequest):
        return await session.send_request(request, ListRootsResult, metadata=related)
    raise MCPError(code=INTERNAL_ERROR, message=f"Cannot ask a {type(request).__name__} on this session")
