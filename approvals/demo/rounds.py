"""Multi round-trip (MRTR) helpers shared by the demo tools.

A tool asks by returning `ask(...)` and reads the answers on the retry with `reply(...)`. On a
handshake-era session `eras.dual_era` runs those rounds inside the one call, asking over the session, and
hands each round's answers and state to the tool through `HandshakeRound` instead of the request.
`requestState` is plain JSON here: the SDK's `RequestStateBoundary` seals it on the way out and
verifies it on the way back, so a tool only ever reads state it minted itself. Each state also names its
call (`CHAIN`, kept from round to round) so that `replay.OneOutcome` can refuse a state of a call that has
already ended: the seal alone would let a copied state run the tool again until it expires.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolResult,
    ClientCapabilities,
    CreateMessageRequest,
    ElicitationCapability,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    FormElicitationCapability,
    InputRequest,
    InputRequiredResult,
    InputResponses,
    ListRootsRequest,
    MissingRequiredClientCapabilityErrorData,
    RootsCapability,
    SamplingCapability,
    TextContent,
    UrlElicitationCapability,
)

from approvals.demo.form_check import schema_problem

Action = Literal["accept", "decline", "cancel"]
CHAIN = "chain"  # the state key naming the call a round belongs to


@dataclass(frozen=True)
class HandshakeRound:
    """A round run inside a handshake-era call: the answers gathered over the session, the state kept."""

    input_responses: InputResponses | None
    request_state: str | None


handshake_round: ContextVar[HandshakeRound | None] = ContextVar("handshake_round", default=None)


def form(message: str, schema: Mapping[str, Any]) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=dict(schema)))


def url(message: str, target: str) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestURLParams(message=message, url=target))


def ask(
    ctx: Context, requests: Mapping[str, InputRequest], state: Mapping[str, Any] | None = None
) -> InputRequiredResult:
    """End this round with `input_required`, refusing to ask for anything the client did not declare."""
    for request in requests.values():
        _require_capability(ctx, request)
    return InputRequiredResult(
        input_requests=dict(requests),
        request_state=None if state is None else json.dumps({**state, CHAIN: _chain(ctx)}),
    )


def state(ctx: Context) -> dict[str, Any]:
    """The state minted by the previous round, or {} on a first call."""
    plain = _request_state(ctx)
    return json.loads(plain) if plain else {}


def responses(ctx: Context) -> InputResponses:
    """Every answer this round received, by key ({} on a first call)."""
    held = handshake_round.get()
    return dict((held.input_responses if held else ctx.input_responses) or {})


def _request_state(ctx: Context) -> str | None:
    held = handshake_round.get()
    return held.request_state if held else ctx.request_state


def chain_of(plain_state: object) -> str | None:
    """The call named by a verified (plaintext) state, or None for a state without one."""
    try:
        decoded = json.loads(plain_state) if isinstance(plain_state, str) else None
    except ValueError:
        return None
    chain = decoded.get(CHAIN) if isinstance(decoded, dict) else None
    return chain if isinstance(chain, str) else None


def _chain(ctx: Context) -> str:
    """The call this round belongs to: the previous round's, or a new one on a first call."""
    return chain_of(_request_state(ctx)) or secrets.token_urlsafe(12)


def response(ctx: Context, key: str) -> Any:
    """The client's raw answer under `key` (an ElicitResult, CreateMessageResult, ... or None)."""
    return responses(ctx).get(key)


@dataclass(frozen=True)
class Reply:
    """One form or URL answer, read against the schema the tool asked with.

    `content` is set only for an accepted answer that satisfies the schema, and holds only the properties
    the schema names; `problem` says why an accepted answer was not usable, so the re-asked form can tell
    the reviewer.
    """

    action: Action | None
    content: dict[str, Any] | None = None
    problem: str | None = None

    @property
    def refused(self) -> bool:
        return self.action in ("decline", "cancel")

    @property
    def accepted(self) -> bool:
        return self.action == "accept" and self.problem is None


def reply(ctx: Context, key: str, schema: Mapping[str, Any] | None = None) -> Reply:
    """Read the answer to the elicitation asked under `key`; `schema` is None for URL mode."""
    answer = response(ctx, key)
    if not isinstance(answer, ElicitResult):
        return Reply(action=None)
    if answer.action != "accept":
        return Reply(action=answer.action)
    if schema is None:
        return Reply(action="accept")
    content = answer.content or {}
    problem = schema_problem(content, schema)
    if problem:
        return Reply(action="accept", problem=problem)
    # Only what the form asked for: a key the schema does not name was never checked, nor seen by a reviewer.
    asked = schema.get("properties", {})
    return Reply(action="accept", content={name: value for name, value in content.items() if name in asked})


def with_problem(message: str, problem: str | None) -> str:
    return f"{message}\n\nThe previous answer was not usable ({problem})." if problem else message


def result(text: str, structured: Any = None, *, error: bool = False) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured, is_error=error
    )


def refusal(answer: Reply, what: str) -> CallToolResult:
    """The final result when a reviewer declined or dismissed the request: nothing was done."""
    verb = "declined" if answer.action == "decline" else "cancelled"
    return result(f"{what} was {verb} by the reviewer.", {"outcome": verb}, error=True)


def declared(ctx: Context) -> ClientCapabilities:
    return ctx.client_capabilities or ClientCapabilities()


def _require_capability(ctx: Context, request: InputRequest) -> None:
    caps = declared(ctx)
    needed: ClientCapabilities | None = None
    if isinstance(request, ElicitRequest):
        elicitation = caps.elicitation
        if isinstance(request.params, ElicitRequestURLParams):
            if elicitation is None or elicitation.url is None:
                needed = ClientCapabilities(elicitation=ElicitationCapability(url=UrlElicitationCapability()))
        # A bare `elicitation: {}` means form mode (spec 2026-07-28, client/elicitation).
        elif elicitation is None or (elicitation.form is None and elicitation.url is not None):
            needed = ClientCapabilities(elicitation=ElicitationCapability(form=FormElicitationCapability()))
    elif isinstance(request, CreateMessageRequest):
        if caps.sampling is None:
            needed = ClientCapabilities(sampling=SamplingCapability())
    elif isinstance(request, ListRootsRequest) and caps.roots is None:
        needed = ClientCapabilities(roots=RootsCapability())
    if needed is not None:
        data = MissingRequiredClientCapabilityErrorData(required_capabilities=needed)
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message="This tool needs a client capability the request did not declare",
            data=data.model_dump(by_alias=True, mode="json", exclude_none=True),
        )
