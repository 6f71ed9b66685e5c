"""The read side: querysets and the JSON shapes the API, webhooks and pages share."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, F, Prefetch, Q, QuerySet
from django.db.models.functions import Coalesce, Least

from approvals import safejson
from approvals.models import (
    AuditEvent,
    Decision,
    Gate,
    Grant,
    InputRequest,
    McpServer,
    Membership,
    Round,
    Team,
    ToolCall,
)
from approvals.permissions import (
    answerable_by,
    answerable_input_requests,
    reviewer_teams,
    teams_in_hand,
    visible_calls,
)
from approvals.prepared import Many, PreparedRead


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


# Large JSON columns a call's JSON never shows: left unread (a field read anyway is loaded on access).
_SERVER_UNREAD = ("server__tools", "server__discover", "server__probe", "server__tool_timeouts")
_ROUND_UNREAD = ("raw", "request_state")


def call_alone() -> QuerySet[ToolCall]:
    """A call with its server and agent, without its rounds and gates (``with_rounds`` adds them)."""
    return ToolCall.objects.select_related("server", "agent").defer(*_SERVER_UNREAD)


def calls_with_rounds() -> QuerySet[ToolCall]:
    return call_alone().prefetch_related(
        Prefetch("gates", queryset=Gate.objects.select_related("decided_by")),
        Prefetch(
            "rounds",
            queryset=Round.objects.defer(*_ROUND_UNREAD)
            .order_by("number")
            .prefetch_related(
                Prefetch("input_requests", queryset=InputRequest.objects.order_by("created_at", "key"))
            ),
        ),
    )


# What `calls_with_rounds` prefetches, for one call, compiled once per process (the agent's long-poll ends
# with it): the same three statements, by the call's id instead of a list of ids.
_CALL_GATES = PreparedRead(
    lambda call: Gate.objects.select_related("decided_by").filter(call=call),
    call=Gate._meta.get_field("call"),
)
_CALL_ROUNDS = PreparedRead(
    lambda call: Round.objects.defer(*_ROUND_UNREAD).filter(call=call).order_by("number"),
    call=Round._meta.get_field("call"),
)
_CALL_REQUESTS = PreparedRead(
    lambda call: InputRequest.objects.filter(round__call=call).order_by("created_at", "key"),
    call=Round._meta.get_field("call"),
)


def with_rounds(call: ToolCall) -> ToolCall:
    """The call (from ``call_alone``) as ``calls_with_rounds`` gives it: its gates, and its rounds with their
    input requests, read and left where ``prefetch_related`` leaves them."""
    rounds = _CALL_ROUNDS(call=call.pk)
    by_round: dict[int, list[InputRequest]] = {rnd.pk: [] for rnd in rounds}
    # A round opened after the rounds' read is left for the next read, with its requests and its gate: so a
    # call without rounds has no requests to read, and one without a gate round no gate (each gate comes
    # with its round, in the transaction that opens it).
    for ir in _CALL_REQUESTS(call=call.pk) if rounds else ():
        if ir.round_id in by_round:
            by_round[ir.round_id].append(ir)
    for rnd in rounds:
        rnd.call = call
        for ir in by_round[rnd.pk]:
            ir.round = rnd
        _prefetched(rnd, "input_requests", by_round[rnd.pk])
    gated = any(rnd.kind == Round.Kind.GATE for rnd in rounds)
    gates = _CALL_GATES(call=call.pk) if gated else []
    for gate in gates:
        gate.call = call
    _prefetched(call, "rounds", rounds)
    _prefetched(call, "gates", gates)
    return call


def _prefetched(instance: Any, relation: str, rows: list[Any]) -> None:
    """As ``prefetch_related`` leaves a relation: its manager's queryset, holding these rows as its result."""
    queryset = getattr(instance, relation).all()
    queryset._result_cache = rows
    queryset._prefetch_done = True
    instance.__dict__.setdefault("_prefetched_objects_cache", {})[relation] = queryset


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
                "kind": rnd.kind,
                "server_deadline": _iso(rnd.server_deadline),
                "outcome": rnd.outcome or None,
                "input_requests": [input_request_summary(ir) for ir in rnd.input_requests.all()],
            }
            for rnd in call.rounds.all()
        ],
        "result": call.result,
        "result_truncated": call.result_truncated,
        "result_size": call.result_size,
        "error": call.error,
        "progress": call.progress,
        "gate": gate_summary(call),
        "created_at": _iso(call.created_at),
        "updated_at": _iso(call.updated_at),
    }


def gate_summary(call: ToolCall) -> dict[str, Any] | None:
    """The call's latest gate for the agent (call JSON, the MCP result's _meta) and the call page; reads
    the gates `calls_with_rounds` prefetched."""
    every = sorted(call.gates.all(), key=lambda gate: gate.created_at)
    if not every:
        return None
    gate = every[-1]
    return {
        "status": gate.status,
        "digest": gate.approved_digest or gate.digest,
        "asked_digest": gate.digest,
        "arguments_asked": gate.arguments,
        "diff": gate.diff,
        "decided_by": gate.decided_by.get_username() if gate.decided_by else None,
        "reason": gate.reason,
        "voided": sum(1 for earlier in every if earlier.status == Gate.Status.VOIDED),
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
        # Who asks: a call the hub sends, or a relay of questions an agent received itself; the agent, and
        # the person it acts for (as the dashboard's cards say).
        "kind": call.kind,
        "agent": call.agent.name if call.agent else None,
        "on_behalf_of": call.on_behalf_of.get_username() if call.on_behalf_of else None,
        "key": ir.key,
        "mode": ir.mode,
        "message": ir.message,
        "created_at": _iso(ir.created_at),
        "deadline": _iso(ir.round.deadline),
        "flags": ir.flags,
    }
    if ir.round.server_deadline is not None:
        # A push round: the server itself waits only until then; after that the request is gone.
        item["server_deadline"] = _iso(ir.round.server_deadline)
    if ir.mode == InputRequest.Mode.FORM:
        item["requested_schema"] = ir.form_schema
    else:
        item["url"] = ir.url
    item["team"] = ir.team.slug if ir.team else None
    gate = getattr(ir.round, "gate", None) if ir.round.kind == Round.Kind.GATE else None
    if gate is not None:
        # A gate: the call waits for approval before it is sent. The tool as the server claims it.
        item["gate"] = {
            "agent": call.agent.name if call.agent else None,
            "on_behalf_of": call.on_behalf_of.get_username() if call.on_behalf_of else None,
            "tool": gate.tool,
            "arguments": gate.arguments,
            "digest": gate.digest,
            "decide_url": f"/api/v1/input-requests/{ir.pk}/decide",
        }
    if ir.escalated_at:
        item["escalated_to"] = ir.escalation_team.slug if ir.escalation_team else None
    if ir.approvals_required > 1:
        item["approvals"] = approvals_summary(ir)
    return item


# Where `with_approvals` leaves a request's approvals so far, read with those of the rest of its page.
_APPROVALS_READ = "_approvals_given"


def _approvals_given(request_ids: list[Any]) -> list[Decision]:
    """The approvals that count so far of these requests, oldest first, with their reviewers."""
    return list(
        Decision.objects.filter(
            input_request__any=request_ids,
            action=InputRequest.Action.ACCEPT,
            superseded=False,
            is_final=False,
        )
        .select_related("user")
        .order_by("created_at", "pk")
    )


def with_approvals(requests: list[InputRequest]) -> list[InputRequest]:
    """The requests, those needing several approvals with who approved so far (`approvals_summary`): one
    statement for all of them, not one per request of an inbox page."""
    several = [ir for ir in requests if ir.approvals_required > 1]
    if not several:
        return requests
    given: dict[Any, list[Decision]] = {ir.pk: [] for ir in several}
    for decision in _approvals_given(list(given)):
        given[decision.input_request_id].append(decision)
    for ir in several:
        setattr(ir, _APPROVALS_READ, given[ir.pk])
    return requests


def approvals_summary(ir: InputRequest) -> dict[str, Any]:
    """For N-of-M policies: how many are needed, and who approved which values so far (later reviewers
    confirm those values, or send their own, which restarts the count)."""
    given = getattr(ir, _APPROVALS_READ, None)
    if given is None:
        given = _approvals_given([ir.pk])
    return {
        "required": ir.approvals_required,
        "given": [
            {
                "user": d.user.get_username() if d.user else None,
                "content": d.content,
                "at": _iso(d.created_at),
            }
            for d in given
        ],
    }


# What an inbox item never shows, left unread: the request's verbatim params, answer and routing, the
# round's raw result and state, the call's outcome, the server's stored configuration and tool list (the
# largest of all, read for every item of every page otherwise), and what a gate records once decided.
_INBOX_DEFER = (
    "params",
    "content",
    "routing",
    "round__raw",
    "round__request_state",
    "round__call__result",
    "round__call__error",
    "round__call__progress",
    "round__call__input_responses",
    "round__call__agent_client",
    *McpServer.stored_json("round__call__server"),
    "round__gate__approved_arguments",
    "round__gate__diff",
)


def inbox(user: Any, team_ids: list[int] | None = None) -> QuerySet[InputRequest]:
    return _inbox_order(answerable_input_requests(user, team_ids))


# The inbox's order, oldest first; its cursor holds the three.
INBOX_ORDER = ("created_at", "key", "id")


def _inbox_order(requests: QuerySet[InputRequest]) -> QuerySet[InputRequest]:
    return (
        requests.pending()  # type: ignore[attr-defined]
        .select_related(
            "round__call__server",
            "round__call__agent",
            "round__call__on_behalf_of",
            "round__gate",
            "team",
            "escalation_team",
        )
        .defer(*_INBOX_DEFER)
        .order_by(*INBOX_ORDER)
    )


_TEAMS_BY_MEMBER = PreparedRead(
    lambda user: reviewer_teams(user).values_list("pk", "slug"),
    user=Membership._meta.get_field("user"),
)
_EVERY_TEAM = PreparedRead(lambda: Team.objects.values_list("pk", "slug"))


def inbox_teams(user: Any) -> list[tuple[int, str]]:
    """The teams whose queues hold this user's inbox, (id, slug) by slug: their answering teams, every team
    for a superuser (the unrouted queue comes on top: requests assigned to them, staff's unrouted ones)."""
    if user.is_superuser:
        teams = _EVERY_TEAM()
    else:
        in_hand = teams_in_hand(user)
        teams = _TEAMS_BY_MEMBER(user=user.pk) if in_hand is None else in_hand
    return sorted(teams, key=lambda team: team[1])


class BadCursor(ValueError):
    pass


def inbox_cursor(pk: uuid.UUID, created_at: datetime, key: str) -> str:
    """An opaque position after the request `pk` in the inbox's order (created_at, key, id)."""
    raw = json.dumps([created_at.isoformat(), key, str(pk)], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def check_cursor(cursor: str) -> None:
    """Raise BadCursor unless `cursor` is one the inbox gave (in form: its request may have gone since)."""
    _position(cursor)


def _position(cursor: str) -> tuple[datetime, str, uuid.UUID]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at_text, key, pk = json.loads(text)
        at = datetime.fromisoformat(at_text)
        pk = uuid.UUID(pk)
        if not isinstance(key, str) or safejson.text_problem(key):
            raise ValueError("bad key")
        if at.tzinfo is None:
            raise ValueError("a cursor's time has its zone")
    except (ValueError, TypeError) as exc:
        raise BadCursor("cursor is not one the inbox gave") from exc
    return at, key, pk


# An inbox page is two statements. The first chooses the page on the requests' own table: its ids and
# positions, oldest first. The second reads those rows with everything an item shows (six more tables). So a
# backlog of pending requests costs a sort of narrow rows, not a join of each of them with six tables (one
# statement joined every pending request the reviewer may answer before it sorted and cut the page).
# The first has one shape per reader (a superuser, staff, anyone else), whether it starts after a cursor,
# and its length (at most ELICIT_INBOX_MAX + 1); each is compiled once per process.
_INBOX_PAGES: dict[tuple[bool, bool, bool, int], PreparedRead[tuple[uuid.UUID, datetime, str]]] = {}


def _inbox_page_read(
    superuser: bool, staff: bool, after: bool, size: int
) -> PreparedRead[tuple[uuid.UUID, datetime, str]]:
    shape = (superuser, staff, after, size)
    read = _INBOX_PAGES.get(shape)
    if read is not None:
        return read
    field = InputRequest._meta.get_field
    fields: dict[str, Any] = {"user": field("assignee")}
    if not superuser:
        fields["teams"] = Many(InputRequest.team.field)
    if after:
        fields.update(at=field("created_at"), key=field("key"), pk=field("id"))

    def build(user: Any, teams: list[int] | None = None, **position: Any) -> QuerySet[Any]:
        rows = answerable_by(user, superuser=superuser, staff=staff, teams=teams).pending()
        if after:
            at, key, pk = position["at"], position["key"], position["pk"]
            rows = rows.filter(
                Q(created_at__gt=at) | Q(created_at=at, key__gt=key) | Q(created_at=at, key=key, pk__gt=pk)
            )
        return rows.order_by(*INBOX_ORDER).values_list("pk", "created_at", "key")[:size]

    return _INBOX_PAGES.setdefault(shape, PreparedRead(build, **fields))


# The page's rows, by id, still pending (one answered since the page was chosen is left out).
_INBOX_ITEMS = PreparedRead(
    lambda ids: _inbox_order(InputRequest.objects.filter(pk__any=ids)),
    ids=Many(InputRequest._meta.pk),
)


def inbox_page(
    user: Any, *, limit: int, cursor: str | None = None, team_ids: list[int] | None = None
) -> tuple[list[InputRequest], str | None]:
    """Up to `limit` items after `cursor`, and the cursor of the next page (None on the last one).
    ``team_ids``: the user's answering teams, when just read (`inbox_teams`)."""
    position = _position(cursor) if cursor else None
    if not user.is_authenticated:
        return [], None
    superuser = bool(user.is_superuser)
    read = _inbox_page_read(superuser, bool(user.is_staff) and not superuser, position is not None, limit + 1)
    values: dict[str, Any] = {"user": user.pk}
    if not superuser:
        values["teams"] = [pk for pk, _ in inbox_teams(user)] if team_ids is None else team_ids
    if position is not None:
        values["at"], values["key"], values["pk"] = position
    chosen = read(**values)
    page = with_approvals(_INBOX_ITEMS(ids=[pk for pk, _, _ in chosen[:limit]])) if chosen else []
    if len(chosen) > limit:
        return page, inbox_cursor(*chosen[limit - 1])
    return page, None


# --- the reviewer dashboard ------------------------------------------------------------------------------
# Pages get plain values and model rows with the secret columns deferred: a Round's requestState and a
# server's credentials are never loaded for a template.

_DASHBOARD_DEFER = ("round__request_state", "round__raw", "round__call__server__headers")


@dataclass
class RoundCard:
    """One round of one call in the queue: the input requests of it that this user may answer."""

    round_id: int
    number: int
    opened_at: datetime
    deadline: datetime
    call: ToolCall
    items: list[InputRequest]
    server_deadline: datetime | None = None  # a push round's: the server stops waiting then

    @property
    def due(self) -> datetime:
        """When the round's requests can last be answered: its deadline, or the server's if that is sooner."""
        if self.server_deadline is not None and self.server_deadline < self.deadline:
            return self.server_deadline
        return self.deadline

    @property
    def pending(self) -> list[InputRequest]:
        return [ir for ir in self.items if ir.status == InputRequest.Status.PENDING]

    @property
    def order(self) -> str:
        """Its place in the queue as text that sorts as the queue does (the page places cards that arrive live
        by it): soonest deadline first (``due``), a round without one after those with one, then the round
        opened first."""
        return f"{_sort_time(self.due)}.{_micros(self.opened_at):020d}.{self.round_id:012d}"

    @property
    def modes(self) -> list[str]:
        return sorted({ir.mode for ir in self.items})

    @property
    def risks(self) -> list[str]:
        """The policy risks of its requests (for the page's risk filter on cards that arrive live)."""
        return sorted({ir.policy.risk for ir in self.items if ir.policy is not None})


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(value: datetime) -> int:
    return max(0, (value - _EPOCH) // timedelta(microseconds=1))


def _sort_time(value: datetime | None) -> str:
    return "9" * 20 if value is None else f"{_micros(value):020d}"


def _dashboard_requests(user: Any) -> QuerySet[InputRequest]:
    return (
        answerable_input_requests(user)
        .select_related(
            "round__call__server",
            "round__call__agent",
            "round__call__on_behalf_of",
            "answered_by",
            "team",
            "policy",
        )
        .defer(*_DASHBOARD_DEFER)
        .order_by("created_at", "key")
    )


def _cards(requests: list[InputRequest]) -> list[RoundCard]:
    cards: dict[int, RoundCard] = {}
    for ir in requests:
        rnd = ir.round
        card = cards.get(rnd.pk)
        if card is None:
            card = cards[rnd.pk] = RoundCard(
                rnd.pk, rnd.number, rnd.opened_at, rnd.deadline, rnd.call, [], rnd.server_deadline
            )
        card.items.append(ir)
    return list(cards.values())


# The queue's risk filter: its value, and the policy risks it shows.
RISK_FILTERS = {"high": ("high",), "medium": ("medium", "high")}


def _queue_pending(user: Any, *, server: str, tool: str, mode: str, risk: str = "") -> QuerySet[InputRequest]:
    pending = answerable_input_requests(user).pending()
    if risk in RISK_FILTERS:
        pending = pending.filter(policy__risk__in=RISK_FILTERS[risk])
    if server:
        # A relay for a server the hub does not know goes by the agent's label (its card's server).
        pending = pending.filter(
            Q(round__call__server__slug=server)
            | Q(round__call__server__isnull=True, round__call__server_label=server)
        )
    if tool:
        pending = pending.filter(round__call__tool=tool)
    if mode:
        pending = pending.filter(mode=mode)
    return pending


def queue_pending_count(
    user: Any, *, server: str = "", tool: str = "", mode: str = "", risk: str = ""
) -> int:
    """How many requests wait in the queue, with its filters: what a page showing only the rounds that
    waited longest keeps its count from."""
    return _queue_pending(user, server=server, tool=tool, mode=mode, risk=risk).count()


@dataclass
class Queue:
    """The queue page: the rounds waiting with the soonest deadlines (at most ELICIT_QUEUE_MAX), and how many
    wait in all."""

    cards: list[RoundCard]
    rounds: int  # rounds with a pending request, shown or not
    pending: int  # pending requests, shown or not

    @property
    def capped(self) -> bool:
        """Rounds wait behind the ones shown."""
        return self.rounds > len(self.cards)


def queue_cards(
    user: Any, *, server: str = "", tool: str = "", mode: str = "", risk: str = "", limit: int
) -> Queue:
    """The `limit` rounds with a request this user may answer whose deadlines come soonest
    (``RoundCard.order``: soonest first, the server's own when sooner, one without a deadline last, then the
    round opened first), filtered by server slug, tool and mode; and how many rounds and requests wait in all.

    The rounds are chosen on the requests' own table and their rounds; only theirs are read with everything a
    card shows, so a backlog of hundreds costs a count and a sort of narrow rows, not a page of hundreds of
    cards."""
    pending = _queue_pending(user, server=server, tool=tool, mode=mode, risk=risk)
    totals = pending.aggregate(pending=Count("pk"), rounds=Count("round_id", distinct=True))
    if not totals["pending"]:
        return Queue([], 0, 0)
    soonest = (
        pending.annotate(due=Least("round__deadline", "round__server_deadline"))
        .values_list("round_id", "due", "round__opened_at")
        .distinct()
        .order_by(F("due").asc(nulls_last=True), "round__opened_at", "round_id")[:limit]
    )
    requests = _dashboard_requests(user).filter(round_id__in=[row[0] for row in soonest])
    if mode:
        requests = requests.filter(mode=mode)
    cards = sorted(_cards(list(requests)), key=lambda card: card.order)
    return Queue(cards, totals["rounds"], totals["pending"])


def round_card_for_everyone(input_request_ids: Any, *, round_id: int | None = None) -> RoundCard | None:
    """The card of the round holding these requests, with all its requests, before any permission filter
    (the websocket consumer loads it once per event and filters it per user with permissions.may_answer).
    ``round_id``, when the event names it, saves looking the round up."""
    if round_id is None:
        round_id = (
            InputRequest.objects.filter(pk__in=input_request_ids).values_list("round_id", flat=True).first()
        )
    if round_id is None:
        return None
    cards = _cards(_ROUND_CARD(round_id=round_id))
    return cards[0] if cards else None


# What a queue card never shows: the server's stored configuration and tool list, the call's outcome, the
# requests' forms and answers. A card is read for every queue event, so none of that JSON is decoded there.
_CARD_DEFER = (
    *_DASHBOARD_DEFER,
    "params",
    "requested_schema",
    "property_order",
    "content",
    "routing",
    "round__call__result",
    "round__call__error",
    "round__call__input_responses",
    "round__call__agent_client",
    *McpServer.stored_json("round__call__server"),
)

# Read for every queue event (once per process, then filtered per socket): compiled once.
_ROUND_CARD = PreparedRead(
    lambda round_id: (
        InputRequest.objects.select_related(
            "round__call__server",
            "round__call__agent",
            "round__call__on_behalf_of",
            "answered_by",
            "team",
            "policy",
        )
        .defer(*_CARD_DEFER)
        .filter(round_id=round_id)
        .order_by("created_at", "key")
    ),
    round_id=InputRequest._meta.get_field("round"),
)


# How many servers and tools the queue's filters offer at most: the names are the agents' and the servers' to
# choose (a relay's tool and label are anything an agent writes), and every reviewer of the team reads the
# list with every queue page. Those with the most requests waiting are offered; a link still filters by any.
FILTER_CHOICES_MAX = 200


def _most_waiting(rows: QuerySet[Any], value: str, shown: str) -> tuple[list[tuple[str, str]], bool]:
    """(value, label) of the FILTER_CHOICES_MAX with the most pending requests among `rows`, by label; and
    whether more wait."""
    fields = list(dict.fromkeys((value, shown)))  # a tool is its own label
    most = [
        (row[0], row[-1])
        for row in rows.values(*fields)
        .annotate(waiting=Count("pk"))
        .order_by("-waiting", shown, value)
        .values_list(*fields)[: FILTER_CHOICES_MAX + 1]
    ]
    shown_first = sorted(most[:FILTER_CHOICES_MAX], key=lambda row: (row[1].casefold(), row[1], row[0]))
    return shown_first, len(most) > FILTER_CHOICES_MAX


def queue_filter_choices(user: Any) -> dict[str, Any]:
    """The queue's filters' choices: the servers, tools and modes of what waits for this user (at most
    FILTER_CHOICES_MAX servers and tools; ``more``: the names of the lists cut short)."""
    pending = answerable_input_requests(user).pending()
    # Each server by its slug and name; a relay's for a server the hub does not know by the agent's label.
    servers, more_servers = _most_waiting(
        pending.annotate(
            server_value=Coalesce("round__call__server__slug", "round__call__server_label"),
            server_shown=Coalesce("round__call__server__name", "round__call__server_label"),
        ),
        "server_value",
        "server_shown",
    )
    tools, more_tools = _most_waiting(pending, "round__call__tool", "round__call__tool")
    modes = pending.values_list("mode", flat=True).distinct().order_by("mode")
    labels = dict(InputRequest.Mode.choices)
    return {
        "servers": servers,
        "tools": tools,
        "modes": [(value, str(labels.get(value, value))) for value in modes],
        "more": [name for name, cut in (("servers", more_servers), ("tools", more_tools)) if cut],
    }


def dashboard_request(pk: Any) -> InputRequest | None:
    return (
        InputRequest.objects.select_related(
            "round__call__server",
            "round__call__agent",
            "round__call__on_behalf_of",
            "answered_by",
            "team",
            "policy",
        )
        .defer(*_DASHBOARD_DEFER)
        .filter(pk=pk)
        .first()
    )


def dashboard_call(pk: Any) -> ToolCall | None:
    return (
        ToolCall.objects.select_related("server", "agent", "on_behalf_of")
        .defer("server__headers")
        .prefetch_related(
            Prefetch(
                "rounds",
                queryset=Round.objects.defer("request_state", "raw")
                .order_by("number")
                .prefetch_related(
                    Prefetch(
                        "input_requests",
                        queryset=InputRequest.objects.select_related("answered_by").order_by(
                            "created_at", "key"
                        ),
                    )
                ),
            )
        )
        .filter(pk=pk)
        .first()
    )


def call_audit_trail(call: ToolCall) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(call_id=call.pk).order_by("id")


def recent_calls(user: Any, *, since: datetime) -> QuerySet[ToolCall]:
    return (
        visible_calls(user)
        .filter(finished_at__gte=since)
        .select_related("server", "agent")
        .defer("server__headers")
        .order_by("-finished_at")
    )


def call_page(call: ToolCall) -> dict[str, Any]:
    """What the call page (and its live refresh) shows: rounds, answers, the audit trail, the result."""
    return {
        "call": call,
        "rounds": list(call.rounds.all()),
        "audit": list(call_audit_trail(call)),
        "gate": gate_summary(call),
    }


def grant_item(grant: Grant, now: datetime | None = None) -> dict[str, Any]:
    """One grant in GET /api/v1/grants (and POST .../revoke): what it covers, who made it, its uses."""
    state = grant.state(now)  # once: two reads of the clock could tell an active grant that lets nothing by
    return {
        "id": str(grant.pk),
        "state": state,
        # An active grant whose grantor could not make it now (left the team, deactivated) lets nothing
        # through (``grants.grantor_stands``, annotated by ``grants.listing``).
        "lets_calls_through": state == "active" and getattr(grant, "grantor_stands", True),
        "agent": grant.agent.name,
        "on_behalf_of": grant.on_behalf_of.get_username() if grant.on_behalf_of else None,
        "server": grant.server.slug,
        "tool": grant.tool,
        "tool_digest": grant.tool_digest,
        "arguments_mode": grant.arguments_mode,
        "arguments": grant.arguments if grant.arguments_mode == Grant.Arguments.EXACT else None,
        "arguments_digest": grant.arguments_digest or None,
        "conditions": grant.conditions if grant.arguments_mode == Grant.Arguments.CONDITIONS else None,
        "team": grant.team.slug,
        "granted_by": grant.granted_by.get_username() if grant.granted_by else None,
        "created_at": _iso(grant.created_at),
        "expires_at": _iso(grant.expires_at),
        "revoked_at": _iso(grant.revoked_at),
        "revoked_by": grant.revoked_by.get_username() if grant.revoked_by else None,
        "uses": grant.uses,
        "last_used_at": _iso(grant.last_used_at),
        "source_call": str(grant.source_call_id) if grant.source_call_id else None,
    }
