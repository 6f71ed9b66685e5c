"""A reviewer answers one input request: accept (with content), decline (with a reason) or cancel."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.formats import date_format

from approvals import audit, broadcast, permissions, schema_forms
from approvals.audit import Actor
from approvals.models import Decision, InputRequest, Round
from approvals.services.errors import AnswerInvalid, Conflict, Forbidden, Invalid, NotFound
from approvals.services.rounds import round_mark_ready

ACTIONS = set(InputRequest.Action.values)


def describe_answer(ir: InputRequest) -> str:
    """ "accepted by alice at 10:42:07" — the loser of a race is told who won, and when."""
    who = ir.answered_by.get_username() if ir.answered_by else "the hub"
    verb = {"accept": "accepted", "decline": "declined", "cancel": "cancelled"}.get(ir.action, ir.status)
    if ir.status == InputRequest.Status.EXPIRED:
        return f"expired at {date_format(timezone.localtime(ir.answered_at), 'DATETIME_FORMAT')}"
    when = date_format(timezone.localtime(ir.answered_at), "DATETIME_FORMAT") if ir.answered_at else "earlier"
    return f"{verb} by {who} at {when}"


def validate_answer(ir: InputRequest, action: str, content: Any) -> dict[str, Any] | None:
    if action not in ACTIONS:
        raise Invalid(
            "action must be accept, decline or cancel.",
            code="invalid_body",
            fields={"action": "must be accept, decline or cancel"},
        )
    if action != InputRequest.Action.ACCEPT:
        if content not in (None, {}):
            raise Invalid(
                "Only accept carries content.", code="invalid_body", fields={"content": "not allowed"}
            )
        return None
    if ir.mode == InputRequest.Mode.URL:
        if content not in (None, {}):
            raise Invalid(
                "A url-mode request is accepted without content.",
                code="invalid_body",
                fields={"content": "not allowed in url mode"},
            )
        return None
    content = {} if content is None else content
    errors = schema_forms.validate(ir.requested_schema or {}, content)
    if errors:
        raise AnswerInvalid("The answer does not match the requested schema.", fields=errors)
    return content


def input_respond(
    *, input_request_id: Any, user: Any, action: str, content: Any = None, reason: str = ""
) -> InputRequest:
    """Record the final answer; when it completes the round, queue the retry. Exactly one answer wins."""
    ir = (
        InputRequest.objects.select_related("round__call__server", "team").filter(pk=input_request_id).first()
    )
    if ir is None or not permissions.can_answer(user, ir):
        # Someone who may not answer learns nothing about the request's existence.
        if ir is not None and permissions.can_view_call(user, ir.round.call):
            raise Forbidden("You may not answer this request.", code="not_a_reviewer")
        raise NotFound("No such input request.")
    content = validate_answer(ir, action, content)
    reason = (reason or "")[:2000]
    with transaction.atomic():
        # The round lock serialises answers within a round, so exactly one of them sees it complete.
        rnd = Round.objects.select_for_update(of=("self",)).select_related("call__server").get(pk=ir.round_id)
        now = timezone.now()
        won = InputRequest.objects.filter(pk=ir.pk, status=InputRequest.Status.PENDING).update(
            status=InputRequest.Status.ANSWERED,
            action=action,
            content=content,
            reason=reason,
            answered_by=user,
            answered_at=now,
        )
        if not won:
            ir.refresh_from_db()
            raise Conflict(f"This request was already {describe_answer(ir)}.", code="already_answered")
        ir.refresh_from_db()
        Decision.objects.create(
            input_request=ir,
            user=user,
            action=action,
            content=content,
            reason=reason,
            is_final=True,
            created_at=now,
        )
        audit.record(
            actor=Actor.user(user),
            verb="input.answered",
            call=rnd.call,
            input_request=ir,
            data={"key": ir.key, "action": action, "content": _audit_content(ir, content), "reason": reason},
        )
        transaction.on_commit(lambda: broadcast.queue_changed("input.answered", rnd.call_id, [ir]))
        if not rnd.input_requests.pending().exists():
            round_mark_ready(rnd=rnd, outcome=Round.Outcome.ANSWERED)
    return ir


def _audit_content(ir: InputRequest, content: dict[str, Any] | None) -> dict[str, Any] | None:
    """The values as sent, with fields that look like secrets blanked."""
    if content is None:
        return None
    secret = set(schema_forms.sensitive_fields(ir.requested_schema or {}))
    return {key: (audit.REDACTED if key in secret else value) for key, value in content.items()}
