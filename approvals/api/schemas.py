"""Request bodies, and the answers the OpenAPI document describes (built as plain dicts by
approvals.selectors, shared with webhooks)."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Field, Schema
from pydantic import AwareDatetime, field_validator

from approvals.services.answers import MAX_REASON
from approvals.services.calls import MAX_LABEL

MAX_IDEMPOTENCY_KEY = 200  # ToolCall.idempotency_key's length


def _no_reason(value: Any) -> Any:
    """An optional ``reason`` sent as null is one not given, as clients that serialise absent fields as null
    send it."""
    return "" if value is None else value


def _no_arguments(value: Any) -> Any:
    """``arguments`` sent as null are none given, as a tool's ``arguments`` may be left out: Go's encoder
    writes a nil map so, and clients that serialise absent fields as null send it (the gateway takes a
    ``tools/call`` with null arguments likewise)."""
    return {} if value is None else value


def _reason_field() -> Any:
    """A decision's ``reason``: its length is the answer's service's to check (`answers.input_respond`),
    after what became of the request: a client is told first that the request was decided meanwhile (409),
    as it is with a short reason, not that a reason it need not resend was too long. And it counts a line
    break sent as CRLF once, as a browser's textarea does."""
    return Field("", json_schema_extra={"maxLength": MAX_REASON})


def _at() -> Any:
    return Field(..., description="ISO 8601, with its zone.")


def _only(when: str) -> Any:
    """A field the body holds only ``when``: left out otherwise, never null."""
    return Field(None, description=f"Only {when}.")


class CallIn(Schema):
    server: str = Field(..., min_length=1, max_length=200)
    tool: str = Field(..., min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(None, max_length=MAX_IDEMPOTENCY_KEY)
    callback_url: str | None = Field(None, max_length=500)
    on_behalf_of: str | None = Field(None, max_length=150)

    _arguments = field_validator("arguments", mode="before")(_no_arguments)


class RelayIn(CallIn):
    # A label (a server the hub does not know) is kept as the audit log's server slug: at most MAX_LABEL,
    # as the document says; calls.relay_submit refuses a longer one, saying what a label is.
    server: str = Field(..., min_length=1, max_length=200, json_schema_extra={"maxLength": MAX_LABEL})
    input_requests: dict[str, Any]
    expires_in: int | None = None


class RespondIn(Schema):
    action: Literal["accept", "decline", "cancel"]
    content: Any = None
    reason: str = _reason_field()

    _reason = field_validator("reason", mode="before")(_no_reason)


class DecideIn(Schema):
    """A decision on a gate: approve as asked, edit (approve these arguments instead), or decline."""

    decision: Literal["approve", "edit", "decline"]
    arguments: dict[str, Any] | None = None
    reason: str = _reason_field()
    grant: dict[str, Any] | None = None

    _reason = field_validator("reason", mode="before")(_no_reason)


def _a_text(value: Any) -> Any:
    """A time as the API gives it: ISO 8601 text (pydantic would also take a number, as Unix seconds)."""
    if value is not None and not isinstance(value, str):
        raise ValueError("must be an ISO 8601 date and time, with its zone")
    return value


class ExtendIn(Schema):
    """The optional body of an extension: the deadline it extends, as the client last read it."""

    seen: AwareDatetime | None = Field(
        None,
        description="The round's deadline as last read (the inbox item's or the call's `deadline`, ISO 8601 "
        "with its zone). When the deadline is no longer this one (extended meanwhile), the extension is "
        "refused (409 `already_extended`) instead of added again. Left out: every request extends.",
    )

    _seen = field_validator("seen", mode="before")(_a_text)


class Created(Schema):
    id: str
    status: str
    url: str


class ErrorBody(Schema):
    code: str
    message: str
    fields: dict[str, str] = _only("when the problem has a place: each place, and its problem")


class ErrorOut(Schema):
    error: ErrorBody


# --- responses -------------------------------------------------------------------------------------------
# What the OpenAPI document says the endpoints answer. The bodies themselves are built by approvals.selectors
# (shared with webhooks) and sent as built (`endpoints.as_built`); tests check them against these. A field
# with a default of None and no ``| None`` is left out of the body, never null ("only when ...").


class InputRequestOut(Schema):
    id: str
    key: str
    mode: Literal["form", "url"]
    message: str
    status: Literal["pending", "answered", "expired", "unsupported", "cancelled", "gone"]
    action: Literal["accept", "decline", "cancel"] | None
    problem: str = _only("when unsupported: why")
    answered_at: str = _only("once answered, expired or cancelled (ISO 8601)")


class RoundOut(Schema):
    number: int
    opened_at: str = _at()
    closed_at: str | None
    deadline: str = _at()
    kind: Literal["retry", "push", "gate"]
    server_deadline: str | None
    outcome: Literal["answered", "expired", "cancelled", "abandoned", "gone"] | None
    input_requests: list[InputRequestOut]


class GateOut(Schema):
    status: Literal["open", "approved", "used", "declined", "voided", "expired", "cancelled"]
    digest: str
    asked_digest: str
    arguments_asked: dict[str, Any]
    diff: list[dict[str, Any]]
    decided_by: str | None
    reason: str
    voided: int


class CallOut(Schema):
    id: str
    server: str
    tool: str
    arguments: dict[str, Any]
    status: Literal[
        "queued",
        "running",
        "awaiting_input",
        "resuming",
        "answered",
        "completed",
        "failed",
        "expired",
        "cancelled",
    ] = Field(..., description="answered: a relay's only.")
    rounds: list[RoundOut]
    result: dict[str, Any] | None
    result_truncated: bool
    result_size: int | None
    error: dict[str, Any] | None
    progress: dict[str, Any] | None
    gate: GateOut | None
    created_at: str = _at()
    updated_at: str = _at()


class RelayOut(CallOut):
    input_responses: dict[str, dict[str, Any]] | None = Field(
        ..., description="Null until every request is answered; on expiry, unanswered keys are cancel."
    )


class InboxGateOut(Schema):
    agent: str | None
    on_behalf_of: str | None
    tool: dict[str, Any]
    arguments: dict[str, Any]
    digest: str
    decide_url: str


class InboxItemOut(Schema):
    id: str
    call: str
    server: str
    server_name: str
    tool: str
    arguments: dict[str, Any]
    kind: Literal["call", "relay"]
    agent: str | None
    on_behalf_of: str | None
    key: str
    mode: Literal["form", "url"]
    message: str
    created_at: str = _at()
    deadline: str = _at()
    flags: list[str]
    team: str | None
    server_deadline: str = _only("for a push round (ISO 8601)")
    requested_schema: dict[str, Any] = _only("in form mode")
    url: str = _only("in url mode")
    gate: InboxGateOut = _only("for a gate")
    escalated_to: str | None = _only("once escalated")
    approvals: dict[str, Any] = _only("when several approvals are needed")


class AnsweredOut(Schema):
    id: str
    status: Literal["pending", "answered"] = Field(
        ..., description="pending: approvals still needed (N-of-M)."
    )
    action: Literal["accept", "decline", "cancel"] | None


class ExtendedOut(Schema):
    id: str
    deadline: str = _at()


class GrantOut(Schema):
    id: str
    state: Literal["active", "expired", "revoked"]
    lets_calls_through: bool
    agent: str
    on_behalf_of: str | None
    server: str
    tool: str
    tool_digest: str
    arguments_mode: Literal["exact", "conditions"]
    arguments: dict[str, Any] | None
    arguments_digest: str | None
    conditions: list[dict[str, Any]] | None
    team: str
    granted_by: str | None
    created_at: str = _at()
    expires_at: str | None
    revoked_at: str | None
    revoked_by: str | None
    uses: int
    last_used_at: str | None
    source_call: str | None
