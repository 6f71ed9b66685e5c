"""Pass-through: a question its routing rule gives to the requester goes to the agent's own MCP client.

A 2026-07-28 client gets `resultType: "input_required"` with the elicitation(s) and the hub's OWN
`requestState` (the upstream's stays in the database), sealed by the SDK's `RequestStateBoundary`: AES-GCM
under a key derived from SECRET_KEY (so every gateway process opens it), bound to the tool, its
arguments, the agent and ELICIT_GATEWAY_STATE_TTL. Inside is only `{"call", "round"}`. The client retries
`tools/call` with `inputResponses` and that state; the answers are validated and recorded like a
reviewer's (`answers.requester_respond`) and the call resumes.

A handshake-era client (2025-06-18, 2025-11-25) on a stateful session gets a pushed `elicitation/create`
on the stream of its `tools/call`; its answer is recorded the same way.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import mcp_types as types
from django.conf import settings
from django.utils.crypto import salted_hmac
from mcp.server import ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request

from approvals import safejson
from approvals.gateway import catalog
from approvals.gateway.names import shown
from approvals.models import AgentClient, InputRequest
from approvals.services import answers
from approvals.services.errors import AnswerInvalid, Invalid, ServiceError

logger = logging.getLogger(__name__)

MODERN = "2026-07-28"
HANDSHAKE = "handshake"
AUDIENCE = "elicit-hub/mcp"
MAX_INVALID_ANSWERS = 3  # a handshake-era client whose answers keep failing validation: the hub cancels


def client_of(ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
    """What this request's client can answer itself (stored as `ToolCall.agent_client`): its era, and the
    elicitation modes it declared. An empty `elicitation: {}` means form mode (2025-06-18). A handshake
    client without a back-channel (no stateful session) can answer nothing."""
    era = MODERN if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else HANDSHAKE
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities else None
    modes: list[str] = []
    if elicitation is not None:
        if elicitation.form is not None or elicitation.url is None:
            modes.append("form")
        if elicitation.url is not None:
            modes.append("url")
    if era == HANDSHAKE and not ctx.session.can_send_request:
        modes = []
    return {"era": era, "modes": modes}


def _principal(ctx: ServerRequestContext[Any, Any]) -> str | None:
    request = ctx.request
    found = request.scope.get(catalog.SCOPE_KEY) if isinstance(request, Request) else None
    return f"agent:{found['agent']}" if found else None


def boundary() -> RequestStateBoundary:
    """The SDK's sealing of `requestState`, keyed from SECRET_KEY and bound to the agent."""
    key = salted_hmac("approvals.gateway.request_state", "", algorithm="sha256").digest()
    security = RequestStateSecurity(
        keys=[key], ttl=float(settings.ELICIT_GATEWAY_STATE_TTL), bind_principal=_principal, audience=AUDIENCE
    )
    return RequestStateBoundary(security, default_audience=AUDIENCE)


def _params_for(ask: catalog.Ask, era: str) -> dict[str, Any]:
    params = {k: v for k, v in ask.params.items() if k != "elicitationId"}
    params["mode"] = ask.mode
    if era == HANDSHAKE and ask.mode == "url":
        # 2025-11-25 requires an elicitationId on url mode; the request's own id is stable and not secret.
        params["elicitationId"] = ask.params.get("elicitationId") or ask.id
    return params


def input_required(call_id: str, asks: list[catalog.Ask]) -> types.InputRequiredResult:
    """The interim result for a 2026-07-28 client: the round's questions and the hub's own state (sealed on
    the way out by the boundary)."""
    round_id = asks[0].round_id
    return types.InputRequiredResult.model_validate(
        {
            "inputRequests": {
                ask.key: {"method": "elicitation/create", "params": _params_for(ask, MODERN)}
                for ask in asks
                if ask.round_id == round_id
            },
            "requestState": json.dumps({"call": call_id, "round": round_id}),
        }
    )


def _state(plain: str) -> tuple[str, int]:
    """The call and round a (verified, so hub-minted) requestState names."""
    try:
        state = json.loads(plain)
        return str(state["call"]), int(state["round"])
    except (ValueError, KeyError, TypeError):
        raise MCPError(
            types.INVALID_PARAMS,
            "This requestState was not made by this hub for this request: start the call again.",
            {"reason": "invalid_request_state"},
        ) from None


def _answer(ir_id: str, agent: AgentClient, response: dict[str, Any]) -> None:
    problem = safejson.problem(response, max_depth=settings.ELICIT_MAX_JSON_DEPTH)
    if problem:
        raise Invalid(f"The answer holds {problem[1]} at {problem[0]}.", code="invalid_body")
    answers.requester_respond(
        input_request_id=ir_id,
        agent=agent,
        action=str(response.get("action")),
        content=response.get("content"),
    )


def _check(ir: InputRequest, response: dict[str, Any]) -> None:
    """Refuse (a ServiceError) an answer to a pending request that `_answer` would refuse as invalid. One
    no longer pending is left to `_answer`: the same answer again is no error (a retry that lost its
    response)."""
    if ir.status == InputRequest.Status.PENDING:
        answers.validate_answer(ir, str(response.get("action")), response.get("content"))


def _refusal(exc: ServiceError, key: str) -> MCPError:
    data: dict[str, Any] = {"code": exc.code, "key": key}
    if getattr(exc, "fields", None):
        data["fields"] = exc.fields
    return MCPError(types.INVALID_PARAMS, f"The answer to {key!r} was refused: {exc.message}", data)


async def record_responses(
    db: Any, agent: AgentClient, state: str, responses: dict[str, Any] | None, name: str, slug: str | None
) -> str:
    """A 2026-07-28 retry of the tool ``name`` on `/mcp` (``slug`` None) or `/mcp/<slug>`: check
    `inputResponses` against the round the state names, record each answer, and return the call's id to
    wait on. Refuses (JSON-RPC -32602, a message saying what) a state of another call, or of a server the
    agent may no longer use, keys the round did not ask, malformed answers and answers its schema refuses;
    each answer is checked before any is recorded, so one refused records none."""
    call_id, round_id = _state(state)
    requests = await db(catalog.round_requests, call_id, round_id)
    if not requests or not await db(catalog.retried_call, call_id, agent.pk, name, slug):
        raise MCPError(
            types.INVALID_PARAMS,
            "This requestState does not name a question this agent was asked: start the call again.",
            {"reason": "invalid_request_state"},
        )
    given = {}
    for key, response in (responses or {}).items():
        dumped = response.model_dump(by_alias=True, mode="json", exclude_none=True)
        if key not in requests:
            raise MCPError(
                types.INVALID_PARAMS, f"inputResponses names {shown(key)!r}, which this round did not ask."
            )
        if not isinstance(response, types.ElicitResult):
            raise MCPError(types.INVALID_PARAMS, f"The answer to {key!r} is not an elicitation result.")
        problem = safejson.problem(dumped, max_depth=settings.ELICIT_MAX_JSON_DEPTH)
        if problem:
            raise MCPError(types.INVALID_PARAMS, f"The answer to {key!r} holds {problem[1]} at {problem[0]}.")
        given[key] = dumped
    for key, dumped in given.items():  # every answer checked before one is recorded: one refused records none
        try:
            await db(_check, requests[key], dumped)
        except ServiceError as exc:
            raise _refusal(exc, key) from None
    for key, dumped in given.items():
        try:
            await db(_answer, str(requests[key].pk), agent, dumped)
        except ServiceError as exc:
            raise _refusal(exc, key) from None
    return call_id


async def elicit_on_session(
    ctx: ServerRequestContext[Any, Any], db: Any, agent: AgentClient, asks: list[catalog.Ask], wait: float
) -> None:
    """A handshake-era client: push each question as `elicitation/create` on this tools/call's stream and
    record the answer. An answer its schema refuses, or one that is no elicitation result at all, is asked
    again (at most MAX_INVALID_ANSWERS times, then the hub answers cancel); a client that returns an error to
    the request has cancelled it."""
    for ask in asks:
        params = _params_for(ask, HANDSHAKE)
        for attempt in range(1, MAX_INVALID_ANSWERS + 1):
            try:
                request = types.ElicitRequest(
                    params=types.ElicitRequestURLParams.model_validate(params)
                    if ask.mode == "url"
                    else types.ElicitRequestFormParams.model_validate(params)
                )
            except ValidationError:
                logger.warning("gateway: the request %s cannot be pushed to the agent's client", ask.id)
                response: dict[str, Any] = {"action": "cancel"}
            else:
                try:
                    result = await ctx.session.send_request(
                        request,
                        types.ElicitResult,
                        request_read_timeout_seconds=max(1.0, min(wait, ask.seconds_left)),
                        metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
                    )
                    response = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                except MCPError as exc:
                    # Quoted and cut: the client's own words (a newline in them would forge a log line).
                    logger.info(
                        "gateway: the agent's client refused the elicitation %s: %r", ask.id, shown(str(exc))
                    )
                    response = {"action": "cancel"}
                except ValidationError:
                    # Not an elicitation result at all (an action MCP does not have, content that is not
                    # flat): a wrong answer, asked again as one its schema refuses is.
                    logger.info("gateway: the agent's client answered the elicitation %s malformed", ask.id)
                    if attempt < MAX_INVALID_ANSWERS:
                        continue
                    response = {"action": "cancel"}
            try:
                await db(_answer, ask.id, agent, response)
                break
            except (AnswerInvalid, Invalid):
                if attempt == MAX_INVALID_ANSWERS:
                    await db(_answer, ask.id, agent, {"action": "cancel"})
            except ServiceError as exc:
                logger.info("gateway: the answer to %s was not recorded: %s", ask.id, exc.message)
                break
