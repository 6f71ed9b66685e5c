"""Queue cards as the reviewers' websockets receive them.

A queue event names input requests; each web process reads their round once per event, with every request on
it, and each socket keeps the requests its user may answer and renders the card in its user's language
(``render_card``; ``approvals.consumers``).

A round that opens is rendered once more, by the process that opened it, right after its commit: in the hub's
default language, with nobody looking at it yet (a request just made has no viewers). That rendering travels
in the notice (``prerender``). A socket whose user speaks that language and may answer every request on the
card sends it as it is (``from_notice``): no database read, no thread hop, no second rendering. Anything else
(another language, a card the user sees only part of, a scope not confirmed, a notice without one) is read
again and rendered by the socket's process, as every other event is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

from django.conf import settings
from django.template.loader import render_to_string
from django.utils import translation

from approvals import permissions, selectors
from approvals.models import InputRequest, is_uuid

logger = logging.getLogger(__name__)

# A card larger than this (its tool arguments, say) is not carried in the notice: every process on the
# channel layer would receive it, each long-poll listener included. Sockets then read it as before.
MAX_PRERENDERED = 32 * 1024


class _Answer(Enum):
    READ_AGAIN = "read again"


# What ``from_notice`` answers when the notice's card cannot serve this socket as it is.
READ_AGAIN: Final = _Answer.READ_AGAIN
ReadAgain = Literal[_Answer.READ_AGAIN]


@dataclass(frozen=True)
class NoticedRequest:
    """What ``permissions.may_answer`` reads of an input request, as the notice carries it."""

    for_requester: bool
    assignee_id: Any
    team_id: int | None
    escalation_team_id: int | None


def render(template: str, context: dict[str, Any], language: str) -> str:
    with translation.override(language):
        return render_to_string(template, context)


def render_card(card: selectors.RoundCard, viewers: dict[str, list[str]], me: str, language: str) -> str:
    return render("approvals/_round_card.html", {"card": card, "viewers": viewers, "me": me}, language)


def prerender(round_id: int, ids: list[str]) -> dict[str, Any] | None:
    """The card of a round that has just opened, for its notice; None when it cannot travel in one (the round
    is gone, a request on it was answered already, the card is over MAX_PRERENDERED). Never raises: a card
    that cannot be made here is made by the sockets' processes."""
    try:
        card = selectors.round_card_for_everyone(ids, round_id=round_id)
        if card is None:
            return None
        named = set(ids)
        if any(str(ir.pk) in named and ir.status != InputRequest.Status.PENDING for ir in card.items):
            return None
        language = settings.LANGUAGE_CODE
        html = render_card(card, {}, "", language)
    except Exception:
        logger.exception("the card of round %s could not be rendered for its notice", round_id)
        return None
    if len(html) > MAX_PRERENDERED:
        return None
    return {
        "language": language,
        "round": card.round_id,
        "call": str(card.call.pk),
        "pending": len(card.pending),
        "items": [
            [str(ir.pk), ir.for_requester, ir.assignee_id, ir.team_id, ir.escalation_team_id]
            for ir in card.items
        ],
        "html": html,
    }


def from_notice(
    event: dict[str, Any], scope: permissions.Scope, *, personal: bool = False
) -> dict[str, Any] | ReadAgain | None:
    """The socket's message for a notice that carries its card: the card as it came, None when the user may
    answer none of the requests the notice names (the same answer the card read again would give), or
    READ_AGAIN when the user would see only part of the card. A request made for one person alone counts
    only in the notice to that person's own group (``personal``), not in its team's."""
    card = event["card"]
    try:
        items = [
            (str(pk), NoticedRequest(bool(mine), assignee, team, escalated))
            for pk, mine, assignee, team, escalated in card["items"]
        ]
        html, call, pending = str(card["html"]), str(card["call"]), int(card["pending"])
    except (KeyError, TypeError, ValueError):
        return READ_AGAIN
    named = {pk for pk in event.get("input_requests", []) if is_uuid(pk)}
    allowed = [(pk, item) for pk, item in items if permissions.may_answer(scope, item)]
    mine = [pk for pk, item in allowed if pk in named and (personal or item.assignee_id is None)]
    if not mine:
        return None
    if len(allowed) < len(items):
        return READ_AGAIN
    return {
        "type": "card",
        "event": event.get("event"),
        "group": event.get("group"),
        "seq": event.get("seq"),
        "call": call,
        "round": card.get("round"),
        "pending": pending,
        "input_requests": mine,
        "decided": {},
        "html": html,
    }
