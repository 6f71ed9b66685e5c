"""The read side: querysets and the JSON shapes the API, webhooks and pages share."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Prefetch, QuerySet

from approvals.models import InputRequest, Round, ToolCall
from approvals.permissions import answerable_input_requests


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def calls_with_rounds() -> QuerySet[ToolCall]:
    return ToolCall.objects.select_related("server", "agent").prefetch_related(
        Prefetch(
            "rounds",
            queryset=Round.objects.order_by("number").prefetch_related(
                Prefetch("input_requests", queryset=InputRequest.objects.order_by("created_at", "key"))
            ),
        )
    )


def input_request_summary(ir: InputRequest) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "id": str(ir.pk),
        "key": ir.key,
        "mode": ir.mode,
        "message": ir.message,
        "status": ir.status,
        "action": ir.action or None,
    }
    if ir.problem:
        summary["problem"] = ir.problem
    if ir.answered_at:
        summary["answered_at"] = _iso(ir.answered_at)
    return summary


def call_detail(call: ToolCall) -> dict[str, Any]:
    """The body of GET /api/v1/calls/<id> (and of call.* webhooks). Never includes requestState."""
    return {
        "id": str(call.pk),
        "server": call.server_slug,
        "tool": call.tool,
        "arguments": call.arguments,
        "status": call.status,
        "rounds": [
            {
                "number": rnd.number,
                "opened_at": _iso(rnd.opened_at),
                "closed_at": _iso(rnd.closed_at),
                "deadline": _iso(rnd.deadline),
                "input_requests": [input_request_summary(ir) for ir in rnd.input_requests.all()],
            }
            for rnd in call.rounds.all()
        ],
        "result": call.result,
        "error": call.error,
        "created_at": _iso(call.created_at),
        "updated_at": _iso(call.updated_at),
    }


def relay_detail(call: ToolCall) -> dict[str, Any]:
    body = call_detail(call)
    body["input_responses"] = call.input_responses
    return body


def inbox_item(ir: InputRequest) -> dict[str, Any]:
    call = ir.round.call
    item: dict[str, Any] = {
        "id": str(ir.pk),
        "call": str(call.pk),
        "server": call.server_slug,
        "server_name": call.server_name,
        "tool": call.tool,
        "arguments": call.arguments,
        "key": ir.key,
        "mode": ir.mode,
        "message": ir.message,
        "created_at": _iso(ir.created_at),
        "deadline": _iso(ir.round.deadline),
        "flags": ir.flags,
    }
    if ir.mode == InputRequest.Mode.FORM:
        item["requested_schema"] = ir.requested_schema
    else:
        item["url"] = ir.url
    return item


def inbox(user: Any) -> QuerySet[InputRequest]:
    return (
        answerable_input_requests(user)
        .pending()
        .select_related("round__call__server", "team")
        .order_by("created_at", "key")
    )
