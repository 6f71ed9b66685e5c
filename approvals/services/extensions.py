"""A reviewer extends a round's deadline, where the policy of the request they may answer allows it.

The policy names how long an extension adds (``extend_by`` seconds) and how often a round may be extended
(``max_extensions``). A round holding requests under several policies takes the strictest of them: the
shortest extension, the fewest extensions, and none at all while one of its pending requests is under a
policy that sets a clock (``ttl``) and allows no extension. A round whose server waits on an open stream
only so long (``server_deadline``) is never extended past it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from approvals import broadcast, permissions
from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import InputRequest, McpServer, Policy, Round
from approvals.services.answers import no_longer_pending, refuse
from approvals.services.errors import Conflict, NotFound, moment


@dataclass(frozen=True)
class Terms:
    """What an extension of a round would do now."""

    seconds: int  # added to the deadline (less than the policy's when the server's deadline comes first)
    deadline: datetime  # the new deadline
    policy: Policy  # the request's policy, which allowed it
    since: datetime  # the deadline it extends: a page offering it posts it back (`round_extend`'s `seen`)

    @property
    def label(self) -> str:
        return humanise(self.seconds)


def humanise(seconds: int) -> str:
    """ "15 minutes", "1 hour", "1 hour 30 minutes", "45 seconds": an extension's length on a button."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = []
    if hours:
        parts.append(ngettext("%(n)d hour", "%(n)d hours", hours) % {"n": hours})
    if minutes:
        parts.append(ngettext("%(n)d minute", "%(n)d minutes", minutes) % {"n": minutes})
    if secs or not parts:
        parts.append(ngettext("%(n)d second", "%(n)d seconds", secs) % {"n": secs})
    return " ".join(parts)


def _pending_policies(rnd: Round) -> list[Policy | None]:
    return [
        ir.policy
        for ir in InputRequest.objects.filter(round=rnd, status=InputRequest.Status.PENDING).select_related(
            "policy"
        )
    ]


def terms(ir: InputRequest, rnd: Round, others: list[Policy | None]) -> Terms:
    """The extension the round `rnd` of `ir` may have now (its deadline not yet passed), given the policies
    of the round's pending requests (`others`); Conflict when it may have none."""
    policy = ir.policy
    if policy is None or not policy.extend_by:
        raise Conflict(
            _("This request's policy does not allow extending its deadline."), code="extension_not_allowed"
        )
    allowing = {policy.pk: policy}
    for other in others:
        if other is None or other.pk in allowing:
            continue
        if not other.extend_by:
            if other.ttl:
                raise Conflict(
                    _(
                        "Another request in this round is under the policy “%(policy)s”, which does not "
                        "allow extending the deadline."
                    )
                    % {"policy": other.name},
                    code="extension_not_allowed",
                )
            continue
        allowing[other.pk] = other
    limit = min(p.max_extensions for p in allowing.values())
    if limit == 0:
        raise Conflict(
            _("This request's policy does not allow extending its deadline."), code="extension_not_allowed"
        )
    if rnd.extensions >= limit:
        raise Conflict(
            ngettext(
                "The deadline was already extended %(n)d time, as often as the policy allows.",
                "The deadline was already extended %(n)d times, as often as the policy allows.",
                rnd.extensions,
            )
            % {"n": rnd.extensions},
            code="extensions_exhausted",
        )
    seconds = min(p.extend_by or 0 for p in allowing.values())
    try:
        deadline = rnd.deadline + timedelta(seconds=seconds)
    except OverflowError:  # a policy saved before the admin bounded its seconds: past the calendar's end
        raise Conflict(
            _("This request's deadline cannot be extended any further."), code="extension_capped"
        ) from None
    if rnd.server_deadline is not None and deadline > rnd.server_deadline:
        deadline = rnd.server_deadline
    if deadline <= rnd.deadline:
        assert rnd.server_deadline is not None
        raise Conflict(
            _(
                "The server stops waiting for this answer at %(when)s: the deadline cannot be extended "
                "past it."
            )
            % {"when": moment(rnd.server_deadline)},
            code="extension_capped",
        )
    added = int((deadline - rnd.deadline).total_seconds())
    return Terms(seconds=added, deadline=deadline, policy=policy, since=rnd.deadline)


def offer(ir: InputRequest, user: Any) -> Terms | None:
    """For a request's page: the extension `user` may ask for now, or None (not pending, past its deadline,
    not theirs to answer, or the policies allow none)."""
    rnd = ir.round
    if (
        ir.status != InputRequest.Status.PENDING
        or rnd.status != Round.Status.OPEN
        or rnd.deadline <= timezone.now()
        or ir.policy is None
        or not ir.policy.extend_by
        or not permissions.can_answer(user, ir)
    ):
        return None
    try:
        return terms(ir, rnd, _pending_policies(rnd))
    except Conflict:
        return None


def deadline_close(ir: InputRequest, now: datetime | None = None) -> bool:
    """Less than five minutes (or a fifth of the policy's ttl, when that is less) remain before the round's
    deadline, which has not passed yet."""
    now = now or timezone.now()
    window = 300
    if ir.policy is not None and ir.policy.ttl:
        window = min(window, ir.policy.ttl // 5)
    left = (ir.round.deadline - now).total_seconds()
    return 0 < left < window


def _same_moment(seen: datetime, deadline: datetime) -> bool:
    """``seen`` is the deadline as a client read it, to the millisecond: a client keeping times as
    JavaScript's ``Date`` does sends it back so. (An extension moves a deadline further than that, but for
    one the server's own deadline cuts short, after which no extension is left to add.)"""
    return abs(seen - deadline) < timedelta(milliseconds=1)


def round_extend(*, input_request_id: Any, user: Any, seen: datetime | None = None) -> Round:
    """Extend the deadline of the round holding the request by its policy's ``extend_by`` (see the module).
    Returns the round with its new deadline.

    ``seen``: the deadline the reviewer saw when they asked (the page's offer, `Terms.since`). When the round
    was extended since (a double click, a second tab, another reviewer at the same moment) the extension is
    refused (``already_extended``) rather than added again on top of it."""
    ir = (
        InputRequest.objects.select_related("round__call", "policy", "team", "escalation_team")
        .filter(pk=input_request_id)
        .first()
    )
    if ir is None:
        raise NotFound(_("No such input request."))
    if not permissions.can_answer(user, ir):
        # Recorded, as a refused answer is: someone who may not answer the request tried to move its deadline.
        raise refuse(
            ir,
            user,
            "not_a_reviewer",
            _("Only a reviewer who may answer this request can extend its deadline."),
            refused="extend",
        )
    with transaction.atomic():
        # The round first (the lock order: round, gate, call): answers and the expiry sweep take it too, so
        # an answer or an expiry is either before the extension (and seen here) or after it.
        rnd = (
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
            .filter(pk=ir.round_id)
            .first()
        )
        if rnd is None:
            raise NotFound(_("No such input request."))
        ir.refresh_from_db(fields=["status", "action", "answered_at", "answered_by"])
        if ir.status != InputRequest.Status.PENDING:
            raise no_longer_pending(ir, user)
        if rnd.status != Round.Status.OPEN:
            raise Conflict(
                _("This round is already answered: there is no deadline left to extend."),
                code="already_answered",
            )
        now = timezone.now()
        if rnd.deadline <= now:
            raise Conflict(
                _("This request expired at %(when)s: its deadline can no longer be extended.")
                % {"when": moment(rnd.deadline)},
                code="already_answered",
            )
        if seen is not None and not _same_moment(seen, rnd.deadline):
            raise Conflict(
                _("The deadline was already extended meanwhile: it is now %(when)s.")
                % {"when": moment(rnd.deadline)},
                code="already_extended",
            )
        pending = list(
            InputRequest.objects.filter(round=rnd, status=InputRequest.Status.PENDING).select_related(
                "policy", "team", "escalation_team"
            )
        )
        extension = terms(ir, rnd, [p.policy for p in pending])
        old = rnd.deadline
        rnd.deadline, rnd.extensions = extension.deadline, rnd.extensions + 1
        rnd.save(update_fields=["deadline", "extensions"])
        audit.record(
            actor=Actor.user(user),
            verb="round.extended",
            call=rnd.call,
            input_request=ir,
            data={
                "round": rnd.number,
                "key": ir.key,
                "old_deadline": old.isoformat(),
                "new_deadline": rnd.deadline.isoformat(),
                "policy": extension.policy.name,
                "seconds": extension.seconds,
                "extensions": rnd.extensions,
            },
        )
        # Every open card of the round shows the new deadline: a quiet redraw, as a progress report is.
        transaction.on_commit(
            functools.partial(broadcast.queue_changed, "round.extended", rnd.call.pk, pending or [ir])
        )
    return rnd
