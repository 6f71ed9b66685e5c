"""Deciding a gate: a reviewer's approve / edit / decline (`gate_decide`), and what follows once the gate's
round has its final answer or expired (`gate_decided`: send the call with the approved arguments, or end it).

Above `gates` (opening and checking a gate) and `answers` (recording any answer); `rounds` hands a ready
gate round here through its ready handlers (registered when the app starts, `approvals.apps`).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import broadcast, canonical, permissions, schema_forms
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import Gate, InputRequest, Round, ToolCall
from approvals.queueing import RUN_CALL, enqueue_on_commit
from approvals.services import answers, rounds
from approvals.services.calls import call_finish
from approvals.services.errors import Forbidden, Invalid, NotFound, ServiceError
from approvals.services.gate_checks import check_deadline
from approvals.services.gates import SYSTEM, _audit_data, _grants, arguments_diff, call_digest, is_gate


def gate_decide(
    *,
    input_request_id: Any,
    user: Any,
    decision: str,
    arguments: Any = None,
    reason: str = "",
    grant: Any = None,
    check_only: bool = False,
) -> InputRequest:
    """A reviewer's decision on a gate: ``approve``, ``edit`` (with ``arguments``) or ``decline`` (with a
    ``reason``). Goes through `answers.input_respond`, so permissions, self-approval and N-of-M apply. An
    approval may also carry a remembered grant (``grant``, see ``approvals.services.grants``).
    ``check_only``: refuse what this decision would be refused for now, and decide nothing
    (``answers.input_respond``)."""
    ir = InputRequest.objects.filter(pk=input_request_id).first()
    if ir is None or not is_gate(ir):
        raise NotFound("No such gate.")
    if not permissions.can_answer(user, ir):
        # Refused, and recorded, before anything of the body is read: a grant's conditions are checked against
        # the gate's arguments, so their 400 would tell someone outside the team what the call holds.
        answers.input_respond(
            input_request_id=ir.pk, user=user, action=InputRequest.Action.DECLINE, check_only=True
        )
    elif ir.status != InputRequest.Status.PENDING:
        # What became of the gate is the news, not what is wrong with a decision that came too late.
        raise answers.no_longer_pending(ir, user)
    else:
        check_deadline(ir)
    if decision not in ("approve", "edit", "decline"):
        raise Invalid(
            "decision must be approve, edit or decline.",
            code="invalid_body",
            fields={"decision": "must be approve, edit or decline"},
        )
    if decision == "edit" and not isinstance(arguments, dict):
        raise Invalid(
            "edit needs the arguments to send.", code="invalid_body", fields={"arguments": "required"}
        )
    if decision != "edit" and arguments is not None:
        raise Invalid(
            "Only edit carries arguments.", code="invalid_body", fields={"arguments": "only with edit"}
        )
    grants = _grants()
    choice = None
    if grant is not None:
        if grants is None:
            raise Invalid(
                "This hub does not remember grants.", code="invalid_body", fields={"grant": "unknown"}
            )
        choice = grants.parse_choice(
            grant
        )  # None: no grant chosen (the browser's form always has the fields)
        if choice is not None and decision == "decline":
            raise Invalid(
                "A decline grants nothing.", code="invalid_body", fields={"grant": "only on approve"}
            )
        if choice is not None and not may_grant(user, ir) and permissions.can_answer(user, ir):
            # A grant is the team's (its reviewers list and revoke it): one escalated to, or a request's
            # assignee, decides this gate but makes no standing rule for a team they are not a reviewer of.
            # (One who may not answer at all is refused, and audited, by input_respond.)
            team = ir.team.slug if ir.team else "the gate's team"
            raise _grant_refused(
                ir,
                user,
                Forbidden(
                    f"Only a reviewer of {team} can remember this approval as a grant. Approve without one.",
                    code="forbidden",
                    fields={"grant": "not a reviewer of the gate's team"},
                ),
            )
        if choice is not None and ir.approvals_required > 1:
            # A grant is one reviewer's word for later calls: it cannot stand in for N-of-M.
            raise _grant_refused(
                ir,
                user,
                Invalid(
                    f"No grant can be made here: this gate needs {ir.approvals_required} approvals, and a "
                    "grant would let later calls through on one reviewer's word. Approve without one.",
                    code="invalid_grant",
                    fields={"grant": "not on a gate needing several approvals"},
                ),
            )
        if choice is not None:
            # Before deciding: a grant that could not be made for the arguments approved decides nothing.
            approved = arguments if decision == "edit" else (ir.params or {}).get("arguments")
            choice = grants.check_choice(choice, approved)
    action = InputRequest.Action.DECLINE if decision == "decline" else InputRequest.Action.ACCEPT
    # Not one transaction with the grant: a refused answer is audited in its own (answers.refuse).
    ir = answers.input_respond(
        input_request_id=ir.pk,
        user=user,
        action=action,
        content=arguments,
        reason=reason,
        check_only=check_only,
    )
    if check_only:
        return ir
    if choice is not None and grants is not None and ir.status == InputRequest.Status.ANSWERED:
        try:
            with transaction.atomic():
                gate = Gate.objects.select_related("call").get(round_id=ir.round_id)
                grants.create_from_approval(
                    approver=user,
                    call=gate.call,
                    tool_digest=canonical.digest(gate.tool),
                    choice=choice,
                    team=ir.team,  # the team whose gate this was: the grant stands in for its gates only
                )
        except ServiceError as refusal:
            # Recorded once the grant's own transaction is rolled back, or the record would go with it.
            _grant_refused(ir, user, refusal)
            raise
    return ir


def _grant_refused(ir: InputRequest, user: Any, refusal: ServiceError) -> ServiceError:
    """Record a grant asked for with a decision on gate ``ir`` and refused (``grant.refused``, as a refused
    revoke is) in its own transaction, so the error that follows rolls nothing of it back; return
    ``refusal`` to raise. The event names the gate's call, tool and team and the code the reviewer was
    answered, never the arguments or the grant's conditions."""
    call = ToolCall.objects.get(rounds__pk=ir.round_id)
    team = ir.team.slug if ir.team else ""
    with transaction.atomic():
        audit.record(
            actor=Actor.user(user),
            verb="grant.refused",
            call=call,
            input_request=ir,
            team_slug=team,
            data={
                "code": refusal.code,
                "server": call.server_slug,
                "tool": call.tool,
                "team": team or None,
            },
        )
    return refusal


def may_grant(user: Any, ir: InputRequest) -> bool:
    """A reviewer (or admin) of the gate's own team, or a superuser: who may revoke the grant it makes."""
    if user.is_superuser:
        return True
    return ir.team_id is not None and ir.team_id in permissions.answering_team_ids(user)


def gate_decided(*, rnd: Round, outcome: str) -> None:
    """The gate's request has its final answer (or expired): send the call, or end it. Runs inside the
    answering transaction (`rounds.round_mark_ready`)."""
    now = timezone.now()
    gate = Gate.objects.select_for_update(no_key=True).get(round=rnd)
    call = ToolCall.objects.select_related("server", "agent", "on_behalf_of").get(pk=gate.call_id)
    ir = rnd.input_requests.select_related("team", "answered_by").get()
    Round.objects.filter(pk=rnd.pk).exclude(status=Round.Status.CLOSED).update(
        status=Round.Status.CLOSED, closed_at=now
    )
    who = ir.answered_by.get_username() if ir.answered_by else "A reviewer"
    if outcome == Round.Outcome.EXPIRED or ir.action == InputRequest.Action.CANCEL:
        Gate.objects.filter(pk=gate.pk).update(status=Gate.Status.EXPIRED, decided_at=now)
        call_finish(
            call=call,
            status=ToolCall.Status.EXPIRED,
            error={
                "code": "expired",
                "message": "No one approved this call before the deadline; it was not sent.",
            },
        )
        return
    if ir.action == InputRequest.Action.DECLINE:
        Gate.objects.filter(pk=gate.pk).update(
            status=Gate.Status.DECLINED, reason=ir.reason, decided_by=ir.answered_by, decided_at=now
        )
        audit.record(
            actor=Actor.user(ir.answered_by) if ir.answered_by else SYSTEM,
            verb="gate.declined",
            call=call,
            input_request=ir,
            data=_audit_data(call, ir, gate.digest, reason=ir.reason),
        )
        said = f": {ir.reason}" if ir.reason else " (no reason given)"
        call_finish(
            call=call,
            status=ToolCall.Status.FAILED,
            error={
                "code": "declined",
                "message": f"{who} declined this call{said}. It was not sent.",
                "reason": ir.reason,
                "declined_by": ir.answered_by.get_username() if ir.answered_by else None,
            },
        )
        return
    approved = ir.content if isinstance(ir.content, dict) else dict(gate.arguments)
    diff = arguments_diff(gate.arguments, approved)
    approved_digest = call_digest(
        call=call,
        arguments=approved,
        tool=gate.tool,
        rule=gate.rule,
        rule_revision=gate.rule_revision,
        policy=gate.policy,
        policy_revision=gate.policy_revision,
    )
    Gate.objects.filter(pk=gate.pk).update(
        status=Gate.Status.APPROVED,
        approved_arguments=approved,
        approved_digest=approved_digest,
        diff=diff,
        decided_by=ir.answered_by,
        decided_at=now,
    )
    actor = Actor.user(ir.answered_by) if ir.answered_by else SYSTEM
    if diff:
        ToolCall.objects.filter(pk=call.pk).update(arguments=approved)
        call.arguments = approved
        audit.record(
            actor=actor,
            verb="gate.edited",
            call=call,
            input_request=ir,
            data=_audit_data(
                call, ir, approved_digest, diff=_audited_diff(ir, diff), asked_digest=gate.digest
            ),
        )
    audit.record(
        actor=actor,
        verb="gate.approved",
        call=call,
        input_request=ir,
        data=_audit_data(call, ir, approved_digest, edited=bool(diff), asked_digest=gate.digest),
    )
    ToolCall.objects.filter(pk=call.pk, status=ToolCall.Status.AWAITING_INPUT).update(
        status=ToolCall.Status.QUEUED, updated_at=now
    )
    enqueue_on_commit(RUN_CALL, str(call.pk))
    transaction.on_commit(lambda: broadcast.call_changed(call))


def _audited_diff(ir: InputRequest, diff: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The edit as ``gate.edited`` keeps it: each change's path, with the values of a secret-looking argument
    (by its name, at any depth, as the audit log redacts everywhere; or as the tool's inputSchema marks it, as
    ``input.answered`` does) redacted. Its keys (``from``, ``to``) hide them from the log's own redaction."""
    sensitive = set(schema_forms.sensitive_fields(ir.requested_schema or {}))
    audited = []
    for change in diff:
        path = change["path"]
        kept = {"path": path, "op": change["op"]}
        for side in ("from", "to"):
            if side in change:
                value = audit.REDACTED if path in sensitive else audit.redact({path: change[side]})[path]
                kept[side] = value
        audited.append(kept)
    return audited


rounds.READY_HANDLERS[Round.Kind.GATE] = gate_decided
