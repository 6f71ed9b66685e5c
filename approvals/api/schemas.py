"""Request bodies. Responses are plain dicts shaped by approvals.selectors, shared with webhooks."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Field, Schema

MAX_IDEMPOTENCY_KEY = 200  # ToolCall.idempotency_key's length


class CallIn(Schema):
    server: str = Field(..., min_length=1, max_length=200)
    tool: str = Field(..., min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(None, max_length=MAX_IDEMPOTENCY_KEY)
    callback_url: str | None = Field(None, max_length=500)
    on_behalf_of: str | None = Field(None, max_length=150)


class RelayIn(CallIn):
    input_requests: dict[str, Any]
    expires_in: int | None = None


class RespondIn(Schema):
    action: Literal["accept", "decline", "cancel"]
    content: Any = None
    reason: str = Field("", max_length=2000)


class DecideIn(Schema):
    """A decision on a gate: approve as asked, edit (approve these arguments instead), or decline."""

    decision: Literal["approve", "edit", "decline"]
    arguments: dict[str, Any] | None = None
    reason: str = Field("", max_length=2000)
    grant: dict[str, Any] | None = None


class Created(Schema):
    id: str
    status: str
    url: str


class ErrorBody(Schema):
    code: str
    message: str
    fields: dict[str, str] | None = None


class ErrorOut(Schema):
    error: ErrorBody
