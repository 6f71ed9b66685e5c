"""The audit history pages: search and filters, call timelines, exports, the chain's state, analytics.

Views stay thin: a Form (``approvals.audit.forms``) validates the filters and ``approvals.audit.queries``
turns them into SQL scoped to what the user may see.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from approvals import schema_forms, throttling
from approvals.audit import core as audit
from approvals.audit import export as audit_export
from approvals.audit.forms import AuditFilterForm, CursorForm, TimelineCursorForm
from approvals.audit.queries import (
    analytics,
    events_for,
    is_text_search,
    listed,
    page,
    suggested_servers,
    summarised,
    timeline,
)
from approvals.forms import TZ_FIELD
from approvals.models import AuditEvent
from approvals.permissions import visible_teams
from approvals.ratelimit import SlidingWindowMixin

NEWER_LIMIT = 100


def _reviewer_zone(request: HttpRequest) -> tzinfo:
    """The zone the reader's browser is in (the cookie every dashboard page sets), else the hub's."""
    return schema_forms.resolve_tz(request.COOKIES.get(TZ_FIELD, "")) or timezone.get_default_timezone()


def _on_reviewers_clock(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Read "From" and "Until" and show the events' times in the reader's zone, as the dashboard shows times:
    the same clock for the page, its poll and its exports."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        with timezone.override(_reviewer_zone(request)):
            return view(request, *args, **kwargs)

    return wrapped


def _filters(request: HttpRequest) -> tuple[AuditFilterForm, CursorForm]:
    return AuditFilterForm(request.GET), CursorForm(request.GET)


@never_cache
@require_GET
@login_required
@_on_reviewers_clock
def index(request: HttpRequest) -> HttpResponse:
    form, cursor = _filters(request)
    context: dict[str, Any] = {"form": form, "chain": _chain_state(), "events": []}
    context["teams"] = list(visible_teams(request.user).values_list("slug", flat=True))
    context["servers"] = suggested_servers(request.user)
    # The export links keep the filters even when the cursor is refused: never the whole log instead.
    context["query"] = _query_without(request, "before")
    if not (form.is_valid() and cursor.is_valid()):
        context["cursor_errors"] = cursor.errors if cursor.is_bound else {}
        return render(request, "approvals/audit/index.html", context, status=400)
    before = cursor.cleaned_data["before"]
    # Read the head first: the first page stops there and the live poll starts there, so an event that
    # commits meanwhile is shown once, by the poll.
    newest = _newest_id()
    filters = form.cleaned_data
    events, next_before = page(
        events_for(request.user, filters), before or newest + 1, windowed=is_text_search(filters)
    )
    context.update(
        events=events,
        next_before=next_before,
        is_first_page=not before,
        newest_id=newest,
        stats=analytics(request.user, form.cleaned_data.get("since"), form.cleaned_data.get("until")),
    )
    return render(request, "approvals/audit/index.html", context)


@never_cache
@require_GET
@login_required
@_on_reviewers_clock
def newer(request: HttpRequest) -> HttpResponse:
    """Events newer than ``after`` matching the same filters, newest first: the page polls this.

    Appends hold the chain lock until they commit, so ids become visible in order and "after the newest id
    seen" never skips a late commit.
    """
    form, cursor = _filters(request)
    if not (form.is_valid() and cursor.is_valid()):
        return HttpResponse(status=400)
    after = cursor.cleaned_data["after"] or 0
    newest = _newest_id()
    qs = listed(events_for(request.user, form.cleaned_data).filter(id__gt=after, id__lte=newest))
    events = summarised(list(qs.order_by("id")[:NEWER_LIMIT]))
    seen = events[-1].id if len(events) == NEWER_LIMIT else max(after, newest)
    response = render(request, "approvals/audit/_rows.html", {"events": events[::-1]})
    response["X-Audit-Newest"] = str(seen)
    response["X-Audit-Count"] = str(len(events))
    return response


# Beat checks the chain hourly: a result older than this means the checks stopped (beat or its worker is
# down), and an "intact" from then says nothing about what happened since.
CHAIN_CHECK_STALE = timedelta(hours=2)


def _chain_state() -> dict[str, Any] | None:
    """The last check's result for the page: its times as datetimes (shown on the reader's clock, as every
    time on the page), and whether it is too old to go by."""
    state = audit.last_chain_state()
    if not state:
        return None
    shown = dict(state)
    for name in ("checked_at", "full_checked_at"):
        try:
            shown[name] = datetime.fromisoformat(state[name]) if state.get(name) else None
        except (TypeError, ValueError):
            shown[name] = None
    checked = shown["checked_at"]
    shown["stale"] = checked is not None and timezone.now() - checked > CHAIN_CHECK_STALE
    return shown


def _newest_id() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


@never_cache
@require_GET
@login_required
@_on_reviewers_clock
def call_timeline(request: HttpRequest, call_id: uuid.UUID) -> HttpResponse:
    cursor = TimelineCursorForm(request.GET)
    if not cursor.is_valid():
        return HttpResponse(
            "The page of the timeline is not valid: "
            + "; ".join(str(m) for ms in cursor.errors.values() for m in ms),
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    start = cursor.cleaned_data["start"] or 0
    call, entries, later = timeline(request.user, call_id, start)
    if not entries and call is None:
        raise Http404("No audit events for this call.")
    context = {"call": call, "call_id": call_id, "entries": entries, "start": start, "later": later}
    return render(request, "approvals/audit/timeline.html", context)


# Exports per person (ELICIT_AUDIT_EXPORT_RATE, 60 an hour): each is an audit event and a read of all the
# person may see, so without a limit anyone signed in could fill the log with ``audit.exported`` events.


class ExportRate(SlidingWindowMixin):
    scope = "audit_export"

    def get_cache_key(self, request: HttpRequest) -> str:
        # The person's row: its id and when it was made (ids start again in a database made anew).
        user = request.user
        joined = getattr(user, "date_joined", None)
        ident = f"{user.pk}-{joined.timestamp() if joined else 0}"
        return self.cache_format % {"scope": self.scope, "ident": hashlib.sha256(ident.encode()).hexdigest()}


@never_cache  # the file holds every event the reader may see: no browser or proxy keeps a copy
@require_GET
@login_required
@_on_reviewers_clock
def export(request: HttpRequest, fmt: str) -> HttpResponse | StreamingHttpResponse:
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return HttpResponse(
            "The filters are not valid: " + "; ".join(str(m) for ms in form.errors.values() for m in ms),
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    limit = ExportRate(settings.ELICIT_AUDIT_EXPORT_RATE)
    if not limit.allow_request(request):
        wait = limit.wait() or 60
        response = HttpResponse(
            f"Too many exports: {limit.num_requests} in {(limit.duration or 0) // 60} minutes per person. "
            f"Try again in {throttling.minutes(wait)} min.",
            status=429,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(int(wait))
        return response
    qs = events_for(request.user, form.cleaned_data)
    contiguous = request.user.is_superuser and not form.active()
    return audit_export.export_response(request, qs=qs, fmt=fmt, filters=form.active(), contiguous=contiguous)


@never_cache
@require_GET
@login_required
def chain_head(request: HttpRequest) -> HttpResponse:
    """The chain head as a JSON file, to keep outside the database (compare with verify_audit --head)."""
    if not request.user.is_staff:
        raise PermissionDenied
    head = audit.chain_head()
    response = JsonResponse(head, json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="audit-head-{head["head_id"] or 0}.json"'
    return response


def _query_without(request: HttpRequest, *names: str) -> str:
    params = request.GET.copy()
    for name in names:
        params.pop(name, None)
    return params.urlencode()
