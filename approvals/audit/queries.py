"""The audit log's read side: filters as index-friendly SQL, keyset pages, analytics, call timelines.

``visible_audit_events`` scopes every query to what the user may see; the helpers below turn a filter form's
cleaned data into SQL (full-text search on the stored tsvector, ``column = value`` filters served by
``(column, id)`` B-tree indexes, keyset pagination on ``id`` descending, so pages neither repeat nor skip
events while new ones arrive).
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from typing import Any

from django.contrib.postgres.search import SearchQuery
from django.db import connection, transaction
from django.db.models import Aggregate, Count, DurationField, F, Q, QuerySet, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, Left, NullIf
from django.utils import timezone

from approvals import schema_forms, urlsafety
from approvals.audit import verbs
from approvals.audit.core import redact
from approvals.models import AuditEvent, InputRequest, McpServer, Round, ToolCall, is_uuid
from approvals.permissions import can_view_call, visible_audit_events, visible_calls, visible_teams

PAGE_SIZE = 50
ANALYTICS_DAYS = 30
_EVENT_ID = re.compile(r"^#(\d{1,18})$")


def filter_events(qs: QuerySet[AuditEvent], filters: dict[str, Any]) -> QuerySet[AuditEvent]:
    q = (filters.get("q") or "").strip()
    if q:
        words = Q(search=SearchQuery(q, config="simple", search_type="websearch"))
        if is_uuid(q):
            # The call or input request it names, and every event that mentions it: a UUID is also a
            # resource's id in a call's arguments, and 32 hex digits a trace id or a checksum.
            ident = uuid.UUID(q)
            qs = qs.filter(Q(call_id=ident) | Q(input_request_id=ident) | words)
        elif match := _EVENT_ID.match(q):
            qs = qs.filter(id=int(match.group(1)))
        else:
            qs = qs.filter(words)
    if filters.get("since"):
        qs = qs.filter(at__gte=filters["since"])
    if filters.get("until"):
        qs = qs.filter(at__lt=filters["until"])
    verb = filters.get("verb")
    if verb and verb.endswith(".*"):
        qs = qs.filter(verb__in=verbs.of_noun(verb[:-2]))
    elif verb:
        qs = qs.filter(verb=verb)
    exact = {
        "actor": "actor_label",
        "actor_type": "actor_type",
        "team": "team_slug",
        "server": "server_slug",
        "tool": "tool",
        "action": "action",
        "outcome": "outcome",
        "call": "call_id",
        "input_request": "input_request_id",
    }
    return qs.filter(**{column: filters[name] for name, column in exact.items() if filters.get(name)})


def events_for(user: Any, filters: dict[str, Any]) -> QuerySet[AuditEvent]:
    return filter_events(visible_audit_events(user), filters)


# What a row of the audit table shows of an event's data: the first of these that is set, at most
# SUMMARY_MAX characters (one more is read, so the row can say the text goes on).
SUMMARY_PATHS = ("data__message", "data__reason", "data__problem", "data__error__message")
SUMMARY_MAX = 10_000


def listed(qs: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
    """`qs` as the audit table reads it: without the events' data (``summarised`` reads what a row shows of
    it). An event's data may be as large as a call's arguments (ELICIT_MAX_BODY each): read whole, a page of
    50 such events fetched and decoded tens of megabytes to show a line of each."""
    return qs.defer("search", "data")


def summarised(events: list[AuditEvent]) -> list[AuditEvent]:
    """`events` (a page), each with its ``summary`` read in SQL by id: in a query of its own, not with the
    page, whose plan may sort the matches after its filter and would then work out the summary of every
    event that matches, reading every large one whole for it."""
    if events:
        texts = [NullIf(KT(path), Value("")) for path in SUMMARY_PATHS]
        summaries = dict(
            AuditEvent.objects.filter(id__in=[event.id for event in events])
            .annotate(summary=Left(Coalesce(*texts, Value("")), SUMMARY_MAX + 1))
            .values_list("id", "summary")
        )
        for event in events:
            # Redacted as shown, as a timeline's data is (a row may predate a rule of ``redact``).
            event.summary = redact(summaries.get(event.id) or "")  # type: ignore[attr-defined]
    return events


def suggested_servers(user: Any) -> list[str]:
    """The server names the filter suggests: the reader's teams' servers (and those of no team, for staff, as
    they see unrouted events), never the names of other teams' servers; every server for a superuser."""
    servers = McpServer.objects.all()
    if not user.is_superuser:
        scope = Q(default_team__in=visible_teams(user))
        if user.is_staff:
            scope |= Q(default_team__isnull=True)
        servers = servers.filter(scope)
    return list(servers.order_by("slug").values_list("slug", flat=True))


# A text search first reads the newest ids in id order (bounded work), then, if the page is not full, a
# window sized from the matches found so far, and only then the whole table through the GIN index.
SEARCH_WINDOW = 20_000
SEARCH_WINDOW_MAX = 200_000


def is_text_search(filters: dict[str, Any]) -> bool:
    q = (filters.get("q") or "").strip()
    return bool(q) and not _EVENT_ID.match(q) and not is_uuid(q)


def page(
    qs: QuerySet[AuditEvent], before: int | None, *, windowed: bool = False
) -> tuple[list[AuditEvent], int | None]:
    """One page, newest first, and the cursor of the next (older) page if there is one.

    A text search reads the newest SEARCH_WINDOW ids first, in id order with the search as a filter: a
    word in 1 % of the events fills a page there, so PostgreSQL never fetches and sorts all its matches (a
    common word's GIN bitmap alone costs tens of ms at a million events, and a phrase, which the index
    cannot check, is estimated as the product of its words' frequencies: far too rare). If the window found
    some matches but not a page, the next window is sized from that density; with none, the GIN index
    searches the rest. Windows are disjoint and newest first, so the page is exactly the page without them.
    """
    qs = listed(qs).order_by("-id")
    if not (windowed and before):
        return _cut(list((qs.filter(id__lt=before) if before else qs)[: PAGE_SIZE + 1]))
    rows: list[AuditEvent] = []
    upper, span = before, SEARCH_WINDOW
    while upper > 1 and len(rows) <= PAGE_SIZE:
        lower = upper - span
        wanted = PAGE_SIZE + 1 - len(rows)
        if span > SEARCH_WINDOW_MAX or lower < 1:
            rows += list(qs.filter(id__lt=upper)[:wanted])  # the rest of the table: the planner's choice
            break
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            found = list(qs.filter(id__lt=upper, id__gte=lower)[:wanted])
        rows += found
        # Enough ids for the rest of the page at the density seen, with a margin; none seen: the index.
        span = int(span * wanted / len(found) * 1.5) if found else SEARCH_WINDOW_MAX + 1
        upper = lower
    return _cut(rows)


def _cut(rows: list[AuditEvent]) -> tuple[list[AuditEvent], int | None]:
    more = len(rows) > PAGE_SIZE
    rows = summarised(rows[:PAGE_SIZE])
    return rows, (rows[-1].id if more else None)


class Percentile(Aggregate):
    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = DurationField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def analytics(user: Any, since: Any = None, until: Any = None) -> dict[str, Any]:
    """Time to decision (median, p90), decline and expiry rates, and requests waiting now."""
    until = until or timezone.now()
    since = since or until - timedelta(days=ANALYTICS_DAYS)
    scope = InputRequest.objects.all()
    if not user.is_superuser:
        scope = scope.filter(round__call__in=visible_calls(user))
    window = scope.filter(created_at__gte=since, created_at__lt=until)
    answered = Q(status=InputRequest.Status.ANSWERED)
    waited = F("answered_at") - F("created_at")
    measures = {
        "median": Percentile(waited, 0.5, filter=answered),
        "p90": Percentile(waited, 0.9, filter=answered),
        "answered": Count("pk", filter=answered),
        "declined": Count("pk", filter=answered & Q(action=InputRequest.Action.DECLINE)),
        "expired": Count("pk", filter=Q(status=InputRequest.Status.EXPIRED)),
    }
    groups = {
        "team": Coalesce(F("team__slug"), Value("")),
        "server": Coalesce(F("round__call__server__slug"), F("round__call__server_label")),
    }
    tables = {}
    for name, key in groups.items():
        rows = window.annotate(group=key).values("group").annotate(**measures).order_by("group")
        waiting = dict(
            scope.pending().annotate(group=key).values_list("group").annotate(n=Count("pk")).order_by()
        )
        tables[name] = [_rates(row, waiting.pop(row["group"], 0)) for row in rows] + [
            _rates({"group": group}, count) for group, count in sorted(waiting.items())
        ]
    return {"since": since, "until": until, "by_team": tables["team"], "by_server": tables["server"]}


def _rates(row: dict[str, Any], waiting: int) -> dict[str, Any]:
    answered, declined, expired = row.get("answered", 0), row.get("declined", 0), row.get("expired", 0)
    return {
        "group": row["group"] or "",
        "median": _duration(row.get("median")),
        "p90": _duration(row.get("p90")),
        "answered": answered,
        "decline_rate": _percent(declined, answered),
        "expiry_rate": _percent(expired, answered + expired),
        "waiting": waiting,
    }


def _duration(value: timedelta | None) -> str:
    if value is None:
        return "–"  # noqa: RUF001
    seconds = int(value.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "–"  # noqa: RUF001


# Events a page of a call's timeline shows at most. A call may have 50 rounds of 50 input requests, each
# shown with its schema (up to ELICIT_MAX_SCHEMA) and each round with the server's answer (up to
# ELICIT_MAX_RESULT): read and shown at once, one call's timeline was hundreds of megabytes.
TIMELINE_PAGE = 100


def timeline(
    user: Any, call_id: uuid.UUID, start: int = 0
) -> tuple[ToolCall | None, list[dict[str, Any]], int | None]:
    """A page of a call's visible events in order, from the event ``start`` on, with what reviewers saw and
    sent and what the server said, and the id of the event the next page starts at if there is one."""
    qs = visible_audit_events(user).filter(call_id=call_id, id__gte=start).defer("search").order_by("id")
    events = list(qs[: TIMELINE_PAGE + 1])
    later = events[TIMELINE_PAGE].id if len(events) > TIMELINE_PAGE else None
    events = events[:TIMELINE_PAGE]
    call = ToolCall.objects.select_related("server").filter(pk=call_id).first()
    if call is not None and not can_view_call(user, call):
        call = None  # the events the user may see are shown; the call's own rows are not
    rounds: dict[int, Round] = {}
    requests: dict[uuid.UUID, InputRequest] = {}
    if call is not None:
        # Only the rounds and requests this page's events show.
        numbers = [event.data.get("round") for event in events if event.verb == "round.opened"]
        shown = [event.input_request_id for event in events if event.input_request_id]
        rounds = {
            rnd.number: rnd
            for rnd in call.rounds.filter(number__in=[n for n in numbers if isinstance(n, int)])
        }
        requests = {ir.pk: ir for ir in InputRequest.objects.filter(round__call=call, pk__in=shown)}
    entries = []
    for event in events:
        # Redacted again as shown: a row recorded before a rule of ``redact`` existed keeps what it recorded
        # (its hash covers it, exports give it as it is), but no page shows a secret a rule now finds.
        data = redact(event.data)
        entry: dict[str, Any] = {"event": event, "data": _pretty(data)}
        ir = requests.get(event.input_request_id) if event.input_request_id else None
        if event.verb in {"input.requested", "input.unsupported"}:
            entry["shown"] = {
                "message": data.get("message", ""),
                "mode": data.get("mode", ""),
                "flags": data.get("flags") or [],
                "schema": _pretty(ir.requested_schema) if ir and ir.requested_schema else "",
                "schema_version": schema_forms.fingerprint(ir.requested_schema)[:12]
                if ir and ir.requested_schema
                else "",
                # Where the page was, not the address itself: a sign-in link's token stays out of the trail.
                "url": urlsafety.origin(ir.url) if ir and ir.url else "",
            }
        elif event.verb == "input.answered":
            entry["sent"] = {
                "action": data.get("action", ""),
                "content": _pretty(data.get("content")) if data.get("content") is not None else "",
                "reason": data.get("reason", ""),
            }
        elif event.verb == "round.opened":
            rnd = rounds.get(event.data.get("round"))
            entry["server_answer"] = _pretty(links_hidden(redact(rnd.raw))) if rnd else ""
        elif event.verb in {"call.completed", "call.failed"} and call is not None:
            answer = call.result if call.result is not None else call.error
            entry["server_answer"] = _pretty(links_hidden(redact(answer)))
        entries.append(entry)
    return call, entries, later


def links_hidden(value: Any) -> Any:
    """`value` with every url-mode request's address cut to where it goes (``scheme://host:port``), at any
    depth: a round's raw answer, a ``-32042`` error's ``elicitations``. A sign-in link's token is for the
    person it was made for, not for the audit trail's readers."""
    if isinstance(value, dict):
        hide = value.get("mode") == "url" and isinstance(value.get("url"), str)
        return {
            key: (urlsafety.origin(item) or "[address]" if hide and key == "url" else links_hidden(item))
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [links_hidden(item) for item in value]
    return value


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
