"""A reviewer answers one input request: accept (with content), decline (with a reason) or cancel."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import broadcast, permissions, rules, safejson, schema_forms
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import Decision, InputRequest, McpServer, Round
from approvals.prepared import PreparedRead
from approvals.services.errors import AnswerInvalid, Conflict, Forbidden, Invalid, NotFound, moment
from approvals.services.gate_checks import is_gate, validate_decision
from approvals.services.rounds import round_mark_ready

ACTIONS = set(InputRequest.Action.values)
MAX_REASON = 2000  # characters, line breaks counted once (the API's own limit, and the page's maxlength)
GONE_MESSAGE = (
    "This request is gone: the server stopped waiting for an answer (or the session asking it ended). "
    "Nothing was sent."
)


def _answered_data(ir: InputRequest, action: str, content: Any, reason: str, **more: Any) -> dict[str, Any]:
    """The ``input.answered`` audit event's data, for a reviewer's answer and a requester's alike."""
    return {
        "key": ir.key,
        "action": action,
        "content": _audit_content(ir, content),
        "reason": reason,
        "schema_sha256": schema_forms.fingerprint(ir.requested_schema),
        **more,
    }


def describe_answer(ir: InputRequest) -> str:
    """ "accepted by alice at 2026-12-06 10:42:07 UTC" — the loser of a race is told who won, and when."""
    if ir.status == InputRequest.Status.GONE:
        return "gone: the server stopped waiting"
    when = moment(ir.answered_at) if ir.answered_at else "earlier"
    if ir.status == InputRequest.Status.EXPIRED:
        return f"expired at {when}"
    if ir.status == InputRequest.Status.CANCELLED:
        return f"cancelled by the agent at {when}: it withdrew the call"
    who = ir.answered_by.get_username() if ir.answered_by else "the hub"
    verb = {"accept": "accepted", "decline": "declined", "cancel": "cancelled"}.get(ir.action, ir.status)
    return f"{verb} by {who} at {when}"


def past_deadline(ir: InputRequest) -> bool:
    """Its round's deadline has passed (beat may not have expired it yet): an answer is refused as too late.
    A gate's decision says so its own way."""
    return ir.round.deadline <= timezone.now() and not is_gate(ir)


def no_longer_pending(ir: InputRequest, user: Any = None) -> Conflict:
    """The 409 for an answer to a request that is no longer pending, saying what became of it: to the
    reviewer who answered it (a second tab, a double submit), that they did."""
    if (
        user is not None
        and ir.status == InputRequest.Status.ANSWERED
        and ir.answered_by_id is not None
        and ir.answered_by_id == user.pk
    ):
        when = moment(ir.answered_at) if ir.answered_at else "earlier"
        verb = {"accept": "accepted", "decline": "declined", "cancel": "dismissed"}.get(ir.action, ir.status)
        return Conflict(f"You already {verb} this request at {when}.", code="already_answered")
    if ir.status == InputRequest.Status.GONE:
        return Conflict(GONE_MESSAGE, code="request_gone")
    if ir.status == InputRequest.Status.CANCELLED and is_gate(ir):
        when = moment(ir.answered_at) if ir.answered_at else "earlier"
        return Conflict(
            f"The agent cancelled this call at {when}: it was not sent, and there is nothing left to decide.",
            code="already_answered",
        )
    return Conflict(f"This request was already {describe_answer(ir)}.", code="already_answered")


def too_late(ir: InputRequest) -> Conflict:
    """The 409 for an answer after the round's deadline: beat expires overdue rounds only every few seconds
    (or not at all while no worker runs), and an answer in between comes too late all the same."""
    when = moment(ir.round.deadline)
    return Conflict(
        f"This request expired at {when}: no one answered it before its deadline.", code="already_answered"
    )


def validate_answer(ir: InputRequest, action: str, content: Any) -> dict[str, Any] | None:
    if is_gate(ir):
        return validate_decision(ir, action, content)
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
    assert isinstance(content, dict)  # validate() reports anything but an object
    return content


# The request an answer is for, with what the answer checks (its call, the call's agent and server, its team
# and policy). Every answer reads it, so it is compiled once, and the server's stored configuration and
# tool list, the call's outcome and the round's raw result are left unread.
_ANSWERED = PreparedRead(
    lambda pk: (
        InputRequest.objects.select_related("round__call__server", "round__call__agent", "team", "policy")
        .defer(
            "round__raw",
            "round__request_state",
            "round__call__result",
            "round__call__error",
            "round__call__progress",
            *McpServer.stored_json("round__call__server"),
        )
        .filter(pk=pk)
    ),
    pk=InputRequest._meta.get_field("id"),
)


# The round under its lock, with what the answer's audit events name (the call, its server's default team);
# none of the stored JSON an answer never reads is decoded (the server's answer, the call's result, the
# server's configuration and tool list).
_ROUND_LOCKED = PreparedRead(
    lambda pk: (
        Round.objects.select_for_update(of=("self",), no_key=True)
        .select_related("call__server__default_team")
        .defer(
            "raw",
            "request_state",
            "call__result",
            "call__error",
            "call__progress",
            "call__input_responses",
            *McpServer.stored_json("call__server"),
        )
        .filter(pk=pk)[:1]
    ),
    pk=Round._meta.get_field("id"),
)
_A_PENDING = PreparedRead(
    lambda round: InputRequest.objects.filter(round=round).pending().values_list("pk")[:1],
    round=InputRequest._meta.get_field("round"),
)


def input_respond(
    *,
    input_request_id: Any,
    user: Any,
    action: str,
    content: Any = None,
    reason: str = "",
    check_only: bool = False,
) -> InputRequest:
    """Record the final answer; when it completes the round, queue the retry. Exactly one answer wins.

    ``check_only``: refuse (recorded, as ever) whatever this answer would be refused for now, and record
    nothing else: for a step before the answer itself, such as the browser's second look at a risky one."""
    ir = _ANSWERED.first(pk=input_request_id)
    if ir is None:
        raise NotFound("No such input request.")
    if not permissions.can_answer(user, ir):
        # Ids are random UUIDs, so saying "not yours" reveals nothing guessable; it is recorded.
        if ir.assignee_id:
            raise refuse(
                ir,
                user,
                "not_the_assignee",
                "This sign-in link was made for someone else; only they can open it.",
            )
        raise refuse(
            ir, user, "not_a_reviewer", "You are not a reviewer for the team this request is routed to."
        )
    if ir.status != InputRequest.Status.PENDING:
        # Before the answer is checked: that it came too late is the news, not what was wrong with it.
        raise no_longer_pending(ir, user)
    if past_deadline(ir):
        raise too_late(ir)
    call = ir.round.call
    _check_policy(ir, call, user)
    content = validate_answer(ir, action, content)
    # A browser posts each line break of a textarea as CRLF, though its maxlength counted it once: the reason
    # is measured as the reviewer typed it, and one still too long is refused rather than cut short.
    reason = (reason or "").replace("\r\n", "\n").replace("\r", "\n")
    if len(reason) > MAX_REASON:
        raise Invalid(
            f"The reason is longer than {MAX_REASON} characters; shorten it and send again.",
            code="invalid_body",
            fields={"reason": f"longer than {MAX_REASON} characters"},
        )
    if unstorable := safejson.text_problem(reason):
        raise Invalid(
            f"The reason holds {unstorable}; remove it and send again.",
            code="invalid_body",
            fields={"reason": f"holds {unstorable}"},
        )
    # A request made for one person is theirs alone (rounds opened before routing said so too).
    needs_more = action == InputRequest.Action.ACCEPT and ir.approvals_required > 1 and ir.assignee_id is None
    if check_only:
        if needs_more and _standing_approvals(ir).filter(user_id=user.pk).exists():
            raise _already_approved()
        return ir
    with transaction.atomic():
        # The round lock serialises answers within a round, so exactly one of them sees it complete.
        # With the server's default team: the round's audit events name it.
        rnd = _ROUND_LOCKED.first(pk=ir.round_id)
        if rnd is None:
            raise Round.DoesNotExist(f"no round {ir.round_id}")
        if needs_more and not _approval_completes(ir, user, content, reason):
            return ir
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
            raise no_longer_pending(ir, user)
        # What the UPDATE wrote, set on the row in hand: no read again, and its team stays loaded.
        ir.status, ir.action, ir.content, ir.reason = InputRequest.Status.ANSWERED, action, content, reason
        ir.answered_by, ir.answered_at = user, now
        Decision.objects.create(
            input_request=ir,
            user=user,
            action=action,
            content=content,
            reason=reason,
            is_final=True,
            created_at=now,
        )
        # The answer's events (and the round's, when it completes) join the audit chain together.
        with audit.batched():
            audit.record(
                actor=Actor.user(user),
                verb="input.answered",
                call=rnd.call,
                input_request=ir,
                data=_answered_data(ir, action, content, reason),
            )
            transaction.on_commit(lambda: broadcast.queue_changed("input.answered", rnd.call_id, [ir]))
            if _A_PENDING.first(round=rnd.pk) is None:
                round_mark_ready(rnd=rnd, outcome=Round.Outcome.ANSWERED)
    return ir


def refuse(ir: InputRequest, user: Any, code: str, message: str, **more: Any) -> Forbidden:
    """Record a refusal (they are part of the history too) in its own transaction, and return it to raise.
    ``more``: what else the event says (what was refused, when it was not an answer)."""
    with transaction.atomic():
        audit.record(
            actor=Actor.user(user),
            verb="input.refused",
            call=ir.round.call,
            input_request=ir,
            data={"key": ir.key, "code": code, **more},
        )
    return Forbidden(message, code=code)


def _check_policy(ir: InputRequest, call: Any, user: Any) -> None:
    policy = ir.policy
    forbid_self = policy.forbid_self_approval if policy else True
    # A url-mode request made for its assignee is theirs to open: that is not approving one's own call.
    if forbid_self and ir.assignee_id is None:
        if call.on_behalf_of_id and call.on_behalf_of_id == user.pk:
            raise refuse(
                ir,
                user,
                "self_approval",
                "You cannot answer this request: the agent asked on your behalf. Another reviewer must.",
            )
        if call.agent and call.agent.owner_id and call.agent.owner_id == user.pk:
            raise refuse(
                ir,
                user,
                "self_approval",
                "You cannot answer this request: you own the agent that asked. Another reviewer must.",
            )
    if policy and policy.reauth_within:
        fresh_after = timezone.now() - timedelta(seconds=policy.reauth_within)
        signed_in = permissions.signed_in_at(user)  # this browser session's sign-in; a token's: any
        if signed_in is None or signed_in < fresh_after:
            raise refuse(
                ir, user, "reauth_required", "This policy needs a recent sign-in: sign in again, then answer."
            )


def _approval_completes(ir: InputRequest, user: Any, content: Any, reason: str) -> bool:
    """Record one approval of N. True when it is the Nth distinct approval of the same values by reviewers who
    may all still answer the request."""
    ir.refresh_from_db()
    if ir.status != InputRequest.Status.PENDING:
        raise no_longer_pending(ir, user)
    standing = list(_standing_approvals(ir).select_related("user"))
    if any(d.user_id == user.pk for d in standing):
        raise _already_approved()
    standing = _still_allowed(ir, user, standing)
    # JSON equality (`true` is not `1`): every approval is of exactly the values that will be sent.
    if standing and not rules.same(standing[0].content, content):
        # Different values restart the count: every approval must be of exactly what will be sent.
        _supersede(ir, user, standing)
        standing = []
    if len(standing) + 1 >= ir.approvals_required:
        return True
    Decision.objects.create(
        input_request=ir,
        user=user,
        action=InputRequest.Action.ACCEPT,
        content=content,
        reason=reason,
        is_final=False,
    )
    audit.record(
        actor=Actor.user(user),
        verb="input.approved",
        call=ir.round.call,
        input_request=ir,
        data={
            "key": ir.key,
            "content": _audit_content(ir, content),
            "approvals": len(standing) + 1,
            "required": ir.approvals_required,
        },
    )
    transaction.on_commit(lambda: broadcast.queue_changed("input.answered", ir.round.call_id, [ir]))
    return False


def _standing_approvals(ir: InputRequest) -> Any:
    """The approvals of one of N given so far that still count (none superseded)."""
    return ir.decisions.filter(action=InputRequest.Action.ACCEPT, superseded=False, is_final=False)


def _already_approved() -> Conflict:
    return Conflict(
        "You have already approved this request; another reviewer must confirm it.", code="already_approved"
    )


def _still_allowed(ir: InputRequest, user: Any, standing: list[Decision]) -> list[Decision]:
    """The standing approvals whose reviewers may still answer the request (active, still in its team or
    the team it was escalated to). The others (a reviewer removed from the team, demoted to viewer,
    deactivated or deleted since) no longer count: they are superseded, and the audit log says whose."""
    gone = [
        d
        for d in standing
        if d.user is None or not d.user.is_active or not permissions.can_answer(d.user, ir)
    ]
    if not gone:
        return standing
    _supersede(ir, user, gone, no_longer_allowed=[d.user.get_username() if d.user else None for d in gone])
    return [d for d in standing if d not in gone]


def _supersede(ir: InputRequest, user: Any, decisions: list[Decision], **why: Any) -> None:
    """These approvals no longer count (audited ``input.approvals_restarted``, with `why`)."""
    ir.decisions.filter(pk__in=[d.pk for d in decisions]).update(superseded=True)
    audit.record(
        actor=Actor.user(user),
        verb="input.approvals_restarted",
        call=ir.round.call,
        input_request=ir,
        data={"key": ir.key, "superseded": len(decisions), **why},
    )


def _audit_content(ir: InputRequest, content: dict[str, Any] | None) -> dict[str, Any] | None:
    """The values as sent, with fields that look like secrets blanked."""
    if content is None:
        return None
    secret = set(schema_forms.sensitive_fields(ir.requested_schema or {}))
    return {key: (audit.REDACTED if key in secret else value) for key, value in content.items()}


def requester_respond(*, input_request_id: Any, agent: Any, action: str, content: Any = None) -> InputRequest:
    """Record the answer the agent's own person gave through the agent's MCP client, to a request its rule
    passed through (``for_requester``): validated like a reviewer's answer, audited with the agent as the
    actor, acting for its person. Exactly one answer wins; repeating the same answer is not an error (a
    client may retry after losing the response)."""
    ir = (
        InputRequest.objects.select_related("round__call__agent", "round__call__on_behalf_of")
        .filter(pk=input_request_id, for_requester=True, round__call__agent=agent)
        .first()
    )
    if ir is None:
        raise NotFound("No such input request for this agent.")
    if ir.status == InputRequest.Status.PENDING and past_deadline(ir):
        # As for a reviewer: beat expires overdue rounds only every few seconds, and an answer in between
        # comes too late all the same (the round's expiry, not this answer, decides what the server gets).
        raise too_late(ir)
    try:
        content = validate_answer(ir, action, content)
    except (Invalid, AnswerInvalid):
        if ir.status != InputRequest.Status.PENDING:
            raise no_longer_pending(ir) from None  # too late is the news, not what was wrong with it
        raise
    call = ir.round.call
    person = call.on_behalf_of or (agent.owner if agent.owner_id else None)
    with transaction.atomic():
        # With the server's default team: the round's audit events name it.
        rnd = _ROUND_LOCKED.first(pk=ir.round_id)
        if rnd is None:
            raise Round.DoesNotExist(f"no round {ir.round_id}")
        now = timezone.now()
        won = InputRequest.objects.filter(pk=ir.pk, status=InputRequest.Status.PENDING).update(
            status=InputRequest.Status.ANSWERED,
            action=action,
            content=content,
            answered_by=person,
            answered_at=now,
        )
        if not won:
            ir.refresh_from_db()
            if ir.status == InputRequest.Status.ANSWERED and ir.action == action and ir.content == content:
                return ir
            raise no_longer_pending(ir)
        ir.status, ir.action, ir.content = InputRequest.Status.ANSWERED, action, content
        ir.answered_by, ir.answered_at = person, now
        Decision.objects.create(
            input_request=ir, user=person, action=action, content=content, is_final=True, created_at=now
        )
        # The answer's events (and the round's, when it completes) join the audit chain together.
        with audit.batched():
            audit.record(
                actor=Actor.agent(agent),
                verb="input.answered",
                call=rnd.call,
                input_request=ir,
                data=_answered_data(
                    ir,
                    action,
                    content,
                    "",
                    answered_by="requester",
                    **{"for": person.get_username() if person else "", "channel": "mcp"},
                ),
            )
            transaction.on_commit(lambda: broadcast.call_changed(rnd.call))
            if _A_PENDING.first(round=rnd.pk) is None:
                round_mark_ready(rnd=rnd, outcome=Round.Outcome.ANSWERED)
    return ir
