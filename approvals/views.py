"""Dashboard views: thin; parse, fetch through a permission-checking helper, call one service, render.

Every failure reaches the browser as a readable page or message: a 404 page for what the user may not
see, the request page with the problem beside the field or at the top for a refused answer. No page is
kept by the browser (``never_cache``): Back after answering reads the request again instead of showing it
still pending, and a browser signed out keeps no copy of what the hub showed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from approvals import (
    netguard,
    permissions,
    safejson,
    schema_forms,
    second_look,
    selectors,
    throttling,
    urlsafety,
)
from approvals.forms import PREFIX, TZ_FIELD, AnswerForm, answer_form
from approvals.models import Gate, InputRequest, ToolCall
from approvals.services import answers, extensions, gate_decisions, gates, grants, presence
from approvals.services.errors import AnswerInvalid, Conflict, ServiceError, moment
from approvals.templatetags.approvals_ui import reveal

DECLINE_REASONS = [
    gettext_lazy("I did not start this"),
    gettext_lazy("The values are wrong"),
    gettext_lazy("Not now, try again later"),
    gettext_lazy("Someone else should decide"),
]
RECENT_WINDOW = timedelta(days=1)
RECENT_MAX = 500  # calls the recent page lists, newest first; it says so when more finished


# --- helpers: permission checks and shared context ----------------------------------------------------


def decided_by_post(
    view: Callable[[HttpRequest, UUID], HttpResponse],
) -> Callable[[HttpRequest, UUID], HttpResponse]:
    """A decision's address takes a POST. A visit (the way back after signing in again, a reload, a link)
    goes to the request's page instead of an empty 405."""

    @functools.wraps(view)
    def decide(request: HttpRequest, pk: UUID) -> HttpResponse:
        if request.method in ("GET", "HEAD"):
            return redirect("approvals:request", pk=pk)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        permissions.remember_session(request)  # a policy's recent sign-in is this browser session's
        return view(request, pk)

    return decide


def _overdue(ir: InputRequest) -> bool:
    """Pending, but past its round's deadline: beat has not expired it yet, and an answer would be refused
    as too late (``answers.past_deadline``)."""
    return ir.status == InputRequest.Status.PENDING and answers.past_deadline(ir)


def _get_request_for_user(user: Any, pk: UUID) -> InputRequest:
    """The input request if this user may answer it or see its call; 404 otherwise (existence included)."""
    ir = selectors.dashboard_request(pk)
    if ir is None or not (permissions.can_answer(user, ir) or permissions.can_view_call(user, ir.round.call)):
        raise Http404(_("No such input request."))
    return ir


def _get_call_for_user(user: Any, pk: UUID) -> ToolCall:
    call = selectors.dashboard_call(pk)
    if call is None or not permissions.can_view_call(user, call):
        raise Http404(_("No such call."))
    return call


def _reviewer_tz(request: HttpRequest) -> str:
    """The zone the page shows date-times in: the browser's (a cookie the page sets), else the hub's."""
    zone = request.COOKIES.get(TZ_FIELD, "")
    return zone if zone and schema_forms.resolve_tz(zone) is not None else settings.TIME_ZONE


def _filters(request: HttpRequest) -> dict[str, str]:
    mode = request.GET.get("mode", "")
    server, tool = request.GET.get("server", "")[:50], request.GET.get("tool", "")[:200]
    return {
        # No slug or tool name holds a NUL (PostgreSQL refuses it in a query): such a filter matches nothing.
        "server": server if not safejson.text_problem(server) else "\ufffd",
        "tool": tool if not safejson.text_problem(tool) else "\ufffd",
        "mode": mode if mode in InputRequest.Mode.values else "",
        "risk": risk if (risk := request.GET.get("risk", "")) in selectors.RISK_FILTERS else "",
    }


def _queue_context(request: HttpRequest) -> dict[str, Any]:
    filters = _filters(request)
    queue = selectors.queue_cards(request.user, **filters, limit=settings.ELICIT_QUEUE_MAX)
    ids = [ir.pk for card in queue.cards for ir in card.items]
    filtered = any(filters.values())
    return {
        "cards": queue.cards,
        "filters": filters,
        "filtered": filtered,
        # Nothing matches the filters: how many wait without them, so the empty list is not read as an
        # empty queue (a link from a suggestion or a bookmark names a tool nothing of waits for now).
        "unfiltered_count": (
            selectors.queue_pending_count(request.user) if filtered and not queue.cards else None
        ),
        "viewers": presence.viewers(ids),
        "pending_count": queue.pending,
        "capped": queue.capped,
        "queue_max": settings.ELICIT_QUEUE_MAX,
        "me": request.user.get_username(),
    }


def _with_chosen(choices: dict[str, Any], filters: dict[str, str]) -> dict[str, Any]:
    """The filters' choices (what waits now), with the server and tool the page filters by among them even
    when nothing of theirs waits: the form then says what the list is filtered by, instead of "All"."""
    for name in ("server", "tool"):
        chosen, options = filters[name], choices[name + "s"]
        if chosen and all(value != chosen for value, _label in options):
            choices[name + "s"] = [*options, (chosen, chosen)]
    return choices


def _request_page(
    request: HttpRequest,
    ir: InputRequest,
    *,
    form: AnswerForm | None = None,
    notice: str = "",
    error: str = "",
    status: int = 200,
    review: second_look.Review | None = None,
) -> HttpResponse:
    may_answer = permissions.can_answer(request.user, ir)
    overdue = _overdue(ir)
    pending = ir.status == InputRequest.Status.PENDING and not overdue
    unsupported_form = ""
    if gates.is_gate(ir):
        return _gate_page(request, ir, form=form, notice=notice, error=error, status=status)
    if form is None and ir.mode == InputRequest.Mode.FORM and pending:
        try:
            form = answer_form(ir.form_schema, tz=_reviewer_tz(request))
        except schema_forms.UnsupportedSchema as exc:
            unsupported_form = "; ".join(exc.problems)
    call = ir.round.call
    context = {
        "ir": ir,
        "call": call,
        "round": {
            "number": ir.round.number,
            "deadline": ir.round.deadline,
            "opened_at": ir.round.opened_at,
            "server_deadline": ir.round.server_deadline,
        },
        "may_answer": may_answer,
        "pending": pending,
        "overdue": overdue,
        "form": form,
        "unsupported_form": unsupported_form,
        "url": urlsafety.analyse(ir.url, server_url=call.server.url if call.server else "")
        if ir.mode == InputRequest.Mode.URL
        else None,
        "opened_url": _opened_url(ir.url) if ir.mode == InputRequest.Mode.URL else "",
        # A link made for one person shows in full only to them: never to the team once they were deleted.
        "url_shown": may_answer and (ir.assignee_id is not None or not ir.routing.get("assignee")),
        "viewers": presence.viewers([ir.pk]).get(str(ir.pk), []),
        "notice": notice,
        "error": error,
        "decline_reasons": DECLINE_REASONS,
        # A decline that could not be recorded (answered meanwhile, a reason refused) keeps its reason.
        "reason": request.POST.get("reason", "") if request.method == "POST" else "",
        "sensitive": "sensitive_fields" in (ir.flags or []),
        "value_count": len(form.fields) if form else 0,
        "second_look": bool(second_look.reasons(ir, call)),
        "review": review,
        # One approval of several (a url-mode request made for one person needs only theirs).
        "approvals": selectors.approvals_summary(ir)
        if pending and ir.approvals_required > 1 and ir.assignee_id is None
        else None,
        "extension": extensions.offer(ir, request.user) if pending and may_answer else None,
        "deadline_close": pending and extensions.deadline_close(ir),
    }
    return render(request, "approvals/request.html", context, status=status)


def _with_defaults(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The tool's inputSchema with the asked arguments as the form's starting values."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return schema
    filled = {
        name: ({**spec, "default": arguments[name]} if name in arguments and isinstance(spec, dict) else spec)
        for name, spec in properties.items()
    }
    return {**schema, "properties": filled}


def _gate_page(
    request: HttpRequest,
    ir: InputRequest,
    *,
    form: AnswerForm | None = None,
    json_text: str | None = None,
    edit_errors: dict[str, str] | None = None,
    notice: str = "",
    error: str = "",
    status: int = 200,
    review: second_look.GateReview | None = None,
) -> HttpResponse:
    """A gate: who asks, the tool as the server claims it, the arguments in full, the digest; approve,
    decline with a reason, or edit the arguments (a form from the inputSchema when it fits the form subset,
    else a JSON editor)."""
    call = ir.round.call
    gate = Gate.objects.select_related("decided_by").filter(round_id=ir.round_id).first()
    pending = ir.status == InputRequest.Status.PENDING
    may_answer = permissions.can_answer(request.user, ir)
    asked = dict((gate.arguments if gate else call.arguments) or {})
    schema = ir.form_schema
    if form is None and json_text is None and pending and may_answer:
        try:
            if not schema_forms.check_schema(schema):
                form = answer_form(_with_defaults(schema, asked), tz=_reviewer_tz(request))
        except schema_forms.UnsupportedSchema:
            form = None
    if form is None and json_text is None:
        json_text = json.dumps(asked, indent=2, ensure_ascii=False)
    context = {
        "ir": ir,
        "call": call,
        "gate": gate,
        "tool": (gate.tool if gate else {}) or {},
        "asked": asked,
        "round": {
            "number": ir.round.number,
            "deadline": ir.round.deadline,
            "opened_at": ir.round.opened_at,
            "server_deadline": None,
        },
        "may_answer": may_answer,
        "pending": pending,
        "form": form,
        "json_text": json_text,
        "edit_errors": edit_errors or {},
        "viewers": presence.viewers([ir.pk]).get(str(ir.pk), []),
        "notice": notice,
        "error": error,
        "decline_reasons": DECLINE_REASONS,
        # Only to whoever may make a grant: a reviewer the gate was escalated to approves without one.
        "grant_fields": gates.grants_installed() and gate_decisions.may_grant(request.user, ir),
        "approvals": selectors.approvals_summary(ir) if ir.approvals_required > 1 else None,
        "second_look": bool(second_look.reasons(ir, call, (gate.tool if gate else {}) or {})),
        "review": review,
        "extension": extensions.offer(ir, request.user) if pending and may_answer else None,
        "deadline_close": pending and extensions.deadline_close(ir),
    }
    return render(request, "approvals/gate.html", context, status=status)


# --- pages -----------------------------------------------------------------------------------------------


@login_required
@never_cache
@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    context = _queue_context(request)
    context["choices"] = _with_chosen(selectors.queue_filter_choices(request.user), context["filters"])
    context["filter_choices_max"] = selectors.FILTER_CHOICES_MAX
    context["grant_suggestions"] = grants.suggestions(request.user)
    return render(request, "approvals/queue.html", context)


@login_required
@never_cache
@require_GET
def queue_list(request: HttpRequest) -> HttpResponse:
    """The queue's cards alone: what a page fetches to resync after a gap or a reconnect."""
    return render(request, "approvals/_queue_list.html", _queue_context(request))


@login_required
@never_cache
@require_GET
def queue_count(request: HttpRequest) -> JsonResponse:
    """How many requests wait, with the page's filters: a queue page showing only the rounds that waited
    longest asks for this as rounds come and go behind it, instead of its whole list."""
    return JsonResponse({"pending": selectors.queue_pending_count(request.user, **_filters(request))})


@login_required
@never_cache
@require_GET
def request_detail(request: HttpRequest, pk: UUID) -> HttpResponse:
    return _request_page(request, _get_request_for_user(request.user, pk))


@login_required
@never_cache
@require_GET
def request_state(request: HttpRequest, pk: UUID) -> HttpResponse:
    """The request's decision banner alone (empty while pending), for a page resyncing."""
    ir = _get_request_for_user(request.user, pk)
    return render(request, "approvals/_decided.html", {"ir": ir})


@login_required
@never_cache
@decided_by_post
def respond(request: HttpRequest, pk: UUID) -> HttpResponse:
    ir = _get_request_for_user(request.user, pk)
    if gates.is_gate(ir):
        # A gate is decided with its own form (``gate_decide``: approve, edit, decline), which keeps the
        # arguments its form does not show and takes its own second look; no page posts a gate here.
        return _gate_page(request, ir, error=_("Decide this call with its own buttons."), status=400)
    action = request.POST.get("action", "")
    content = None
    tz = request.POST.get(TZ_FIELD, "")
    # An answer to a request no longer pending, or past its deadline, is not checked: the service says it
    # came too late. Nor is one from someone who may not answer it: the service refuses it, on record.
    checked = ir.status == InputRequest.Status.PENDING and not _overdue(ir)
    checked = checked and permissions.can_answer(request.user, ir)
    if checked and action == InputRequest.Action.ACCEPT and ir.mode == InputRequest.Mode.FORM:
        schema = ir.form_schema
        try:
            content, errors = schema_forms.clean(schema, request.POST, tz=tz, prefix=PREFIX)
        except schema_forms.UnsupportedSchema as exc:
            # The page drew no form for this schema (a check stricter than the one it was stored under):
            # an accept can only come from a stale or forged page. The page says why, as its GET does.
            return _request_page(request, ir, error="; ".join(exc.problems), status=422)
        if errors:
            form = answer_form(schema, tz=tz, data=request.POST, errors=errors)
            return _request_page(request, ir, form=form, status=422)
    try:
        if content is not None and _needs_review(request, ir, content):
            # Whatever the answer would be refused for is said before the review, not after it.
            answers.input_respond(
                input_request_id=ir.pk, user=request.user, action=action, content=content, check_only=True
            )
            form = answer_form(ir.form_schema, tz=tz, data=request.POST)
            fields = [bound.field for bound in form.fields]
            review = second_look.review(ir, ir.round.call, request.user, fields, content)
            return _request_page(request, ir, form=form, review=review)
        ir = answers.input_respond(
            input_request_id=ir.pk,
            user=request.user,
            action=action,
            content=content,
            reason=request.POST.get("reason", ""),
        )
    except Conflict as exc:
        ir.refresh_from_db()
        return _request_page(request, ir, form=_kept(ir, request), notice=exc.message, status=409)
    except AnswerInvalid as exc:
        form = answer_form(
            ir.form_schema, tz=request.POST.get(TZ_FIELD, ""), data=request.POST, errors=exc.fields
        )
        return _request_page(request, ir, form=form, status=422)
    except ServiceError as exc:
        return _request_page(request, ir, form=_kept(ir, request), error=exc.message, status=exc.status)
    messages.success(request, _with_call_link(_sent_message(ir), ir))
    return redirect("approvals:queue")


def _needs_review(request: HttpRequest, ir: InputRequest, values: Any) -> bool:
    """An approval the reviewer may give that needs a second look (``approvals.second_look``) and does not
    carry a token for exactly these values."""
    if not second_look.reasons(ir, ir.round.call) or not permissions.can_answer(request.user, ir):
        return False
    return not second_look.confirmed(request.POST.get(second_look.FIELD, ""), ir, request.user, values)


def _gate_review(
    request: HttpRequest, ir: InputRequest, decision: str, arguments: Any, grant: Any
) -> second_look.GateReview | None:
    """The second look an approval of a risky gate needs (``approvals.second_look``), unless the POST
    carries a token for exactly this decision, these arguments and this grant; None when it needs none."""
    if decision not in ("approve", "edit") or not permissions.can_answer(request.user, ir):
        return None
    call = ir.round.call
    # The tool as the approval is bound to it (the gate's), not as the server's list says now.
    tool = Gate.objects.filter(round_id=ir.round_id).values_list("tool", flat=True).first() or {}
    if not second_look.reasons(ir, call, tool):
        return None
    sent = arguments if decision == "edit" else (ir.params or {}).get("arguments")
    chosen = None
    if grant is not None:
        chosen = [
            grant.get(grants.FIELD_FOR, ""),
            grant.get(grants.FIELD_ARGUMENTS, ""),
            sorted(grant.getlist(grants.FIELD_CONDITION)),
        ]
    values = {"decision": decision, "arguments": sent, "grant": chosen}
    if second_look.confirmed(request.POST.get(second_look.FIELD, ""), ir, request.user, values):
        return None
    return second_look.gate_review(ir, call, request.user, values, request.POST, tool)


def _gate_edit_again(
    request: HttpRequest,
    ir: InputRequest,
    editor: str,
    json_text: str | None,
    error: str,
    status: int,
    *,
    fields: dict[str, str] | None = None,
) -> HttpResponse:
    """The gate page again after a refused decision, with the reviewer's edit as they sent it (the form's
    values, or their JSON) and what was wrong with it (`fields`)."""
    if editor == "form":
        form = answer_form(
            ir.form_schema, tz=request.POST.get(TZ_FIELD, ""), data=request.POST, errors=fields
        )
        return _gate_page(request, ir, form=form, error=error, status=status)
    return _gate_page(
        request, ir, json_text=json_text or "", edit_errors=fields or {}, error=error, status=status
    )


@login_required
@never_cache
@decided_by_post
def gate_decide(request: HttpRequest, pk: UUID) -> HttpResponse:
    """A reviewer's decision on a gate: approve as asked, approve edited arguments, or decline."""
    ir = _get_request_for_user(request.user, pk)
    if not gates.is_gate(ir):
        raise Http404(_("No such gate."))
    decision = request.POST.get("decision", "")
    arguments: Any = None
    tz = request.POST.get(TZ_FIELD, "")
    schema = ir.form_schema
    editor = request.POST.get("editor", "")
    json_text = request.POST.get("arguments_json") if editor == "json" else None
    asked = (ir.params or {}).get("arguments") or {}
    # An edit from someone who may not decide the gate is not read: the service refuses it, on record.
    editing = decision == "edit" and permissions.can_answer(request.user, ir)
    if editing and editor == "form":
        # Against the form as drawn, prefilled with the asked arguments: a value left as asked is sent as is.
        shown = _with_defaults(schema, asked) if isinstance(asked, dict) else schema
        try:
            content, errors = schema_forms.clean(shown, request.POST, tz=tz, prefix=PREFIX)
        except schema_forms.UnsupportedSchema:
            # The asked arguments do not fit the tool's own schema, so the page drew the JSON editor: a form
            # edit can only come from a stale or forged page.
            asked_text = json.dumps(asked, indent=2, ensure_ascii=False)
            error = _("These arguments can only be edited as JSON.")
            return _gate_page(request, ir, json_text=asked_text, error=error, status=422)
        if errors:
            form = answer_form(schema, tz=tz, data=request.POST, errors=errors)
            return _gate_page(request, ir, form=form, status=422)
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        # Arguments the schema does not describe are kept as asked.
        arguments = {**{k: v for k, v in asked.items() if k not in (properties or {})}, **(content or {})}
    elif editing:
        text = json_text or ""
        problem = ""
        if len(text) > gates.MAX_ARGUMENTS:
            problem = _("The arguments are over %(kib)s KiB.") % {"kib": gates.MAX_ARGUMENTS // 1024}
        else:
            try:
                arguments = safejson.loads(text.encode(), max_depth=settings.ELICIT_MAX_JSON_DEPTH)
            except ValueError as exc:
                problem = _("This is not valid JSON: %(why)s") % {"why": exc}
        if problem:
            return _gate_page(request, ir, json_text=text, edit_errors={"arguments": problem}, status=422)
    # The approve and edit forms carry the grant fields; one without a chosen grant carries none.
    grant = request.POST if gates.grants_installed() and request.POST.get(grants.FIELD_FOR) else None
    decide = functools.partial(
        gate_decisions.gate_decide,
        input_request_id=ir.pk,
        user=request.user,
        decision=decision,
        arguments=arguments,
        reason=request.POST.get("reason", ""),
        grant=grant,
    )
    try:
        review = _gate_review(request, ir, decision, arguments, grant)
        if review is not None:
            decide(check_only=True)  # whatever it would be refused for is said before the review
            return _gate_page(request, ir, review=review)
        decide()
    except Conflict as exc:
        ir.refresh_from_db()
        return _gate_page(request, ir, notice=exc.message, status=409)
    except AnswerInvalid as exc:
        return _gate_edit_again(request, ir, editor, json_text, exc.message, 422, fields=exc.fields)
    except ServiceError as exc:
        # Refused before anything was decided (a grant that cannot be made, say): the edit is kept.
        if decision == "edit":
            return _gate_edit_again(request, ir, editor, json_text, exc.message, exc.status)
        return _gate_page(request, ir, error=exc.message, status=exc.status)
    ir.refresh_from_db()
    values = {"server": ir.round.call.server_name, "tool": ir.round.call.tool}
    if ir.status == InputRequest.Status.PENDING:
        sent = _("Your approval of %(tool)s is recorded; another reviewer must confirm it.") % values
    elif ir.action == InputRequest.Action.ACCEPT:
        sent = _("Approved: %(tool)s is sent to %(server)s.") % values
    else:
        sent = _("Declined: %(tool)s is not sent; the agent is told why.") % values
    messages.success(request, _with_call_link(sent, ir))
    return redirect("approvals:queue")


def _opened_url(url: str) -> str:
    """The address a browser opens for a server's `url`, and the one the hub judged: spaces around it and the
    line breaks and tabs in it dropped (as Location, a space before it would make it a path on the hub, and
    one after it would end up in a sign-in link's token)."""
    return netguard.browser_url(url)


@login_required
@never_cache
@decided_by_post
def open_url(request: HttpRequest, pk: UUID) -> HttpResponse:
    """URL mode: record the consent, then send this (new) tab on to the page. Never opened otherwise."""
    ir = _get_request_for_user(request.user, pk)
    call = ir.round.call
    analysis = urlsafety.analyse(ir.url, server_url=call.server.url if call.server else "")
    if ir.mode != InputRequest.Mode.URL or not analysis.openable:
        return _request_page(
            request, ir, error=analysis.refused or _("This request has no page to open."), status=400
        )
    try:
        answers.input_respond(input_request_id=ir.pk, user=request.user, action=InputRequest.Action.ACCEPT)
    except Conflict as exc:
        ir.refresh_from_db()
        return _request_page(request, ir, notice=exc.message, status=409)
    except ServiceError as exc:
        return _request_page(request, ir, error=exc.message, status=exc.status)
    response = HttpResponseRedirect(_opened_url(analysis.url), status=303)
    response["Referrer-Policy"] = "no-referrer"
    return response


@login_required
@never_cache
@decided_by_post
def extend(request: HttpRequest, pk: UUID) -> HttpResponse:
    """Add the policy's extension to the request's deadline (``extensions.round_extend``), then show the
    request again; a refusal is said on the request's page."""
    ir = _get_request_for_user(request.user, pk)
    # The deadline the page offered to extend: a second click (or tab) on the same offer adds nothing. A form
    # without one (an older page) extends as before; one that cannot be read extends nothing, since
    # extending without the guard it asked for could add a second extension.
    seen: datetime | None = None
    if "seen" in request.POST:
        try:
            seen = datetime.fromisoformat(request.POST["seen"])
        except ValueError:
            seen = None
        if seen is None or seen.tzinfo is None:
            error = _(
                "The deadline this page offered to extend could not be read. Reload the page and try again."
            )
            return _request_page(request, ir, error=error, status=400)
    try:
        rnd = extensions.round_extend(input_request_id=ir.pk, user=request.user, seen=seen)
    except ServiceError as exc:
        ir = _get_request_for_user(request.user, pk)  # as it is now (answered or extended meanwhile)
        if isinstance(exc, Conflict):
            return _request_page(request, ir, notice=exc.message, status=409)
        return _request_page(request, ir, error=exc.message, status=exc.status)
    messages.success(request, _("Deadline extended: it is now %(when)s.") % {"when": moment(rnd.deadline)})
    return redirect("approvals:request", pk=ir.pk)


@login_required
@require_POST
def request_presence(request: HttpRequest, pk: UUID) -> HttpResponse:
    """The open request page says "I am looking" every few seconds, and "I left" when it closes."""
    ir = _get_request_for_user(request.user, pk)
    tab = request.POST.get("tab", "")  # which of the reviewer's pages: each of their tabs has its own entry
    if request.POST.get("leave"):
        # Leaving always counts, also after the request was answered (the reviewer who answered it leaves).
        viewers = presence.presence_leave(input_request=ir, user=request.user, tab=tab)
    elif permissions.can_answer(request.user, ir) and ir.status == InputRequest.Status.PENDING:
        viewers = presence.presence_touch(input_request=ir, user=request.user, tab=tab)
    else:
        return HttpResponse(status=204)
    others = [name for name in viewers if name != request.user.get_username()]
    return render(request, "approvals/_presence.html", {"viewers": others})


@login_required
@never_cache
@require_GET
def call_detail(request: HttpRequest, pk: UUID) -> HttpResponse:
    call = _get_call_for_user(request.user, pk)
    return render(request, "approvals/call.html", selectors.call_page(call))


@login_required
@never_cache
@require_GET
def call_body(request: HttpRequest, pk: UUID) -> HttpResponse:
    call = _get_call_for_user(request.user, pk)
    return render(request, "approvals/_call_body.html", selectors.call_page(call))


@login_required
@never_cache
@require_GET
def call_routing(request: HttpRequest, pk: UUID) -> HttpResponse:
    """Read-only: for each input request of the call, which routing rule matched and why others did not."""
    call = _get_call_for_user(request.user, pk)
    requests = (
        InputRequest.objects.filter(round__call=call)
        .select_related("round", "team", "policy", "escalation_team", "assignee")
        .order_by("round__number", "created_at", "key")
    )
    return render(request, "approvals/routing.html", {"call": call, "requests": requests})


@login_required
@never_cache
@require_GET
def recent(request: HttpRequest) -> HttpResponse:
    found = list(selectors.recent_calls(request.user, since=timezone.now() - RECENT_WINDOW)[: RECENT_MAX + 1])
    context = {"calls": found[:RECENT_MAX], "more": len(found) > RECENT_MAX, "recent_max": RECENT_MAX}
    return render(request, "approvals/recent.html", context)


def _kept(ir: InputRequest, request: HttpRequest) -> AnswerForm | None:
    """What the reviewer typed, shown again (read-only) when the answer could not be recorded."""
    if ir.mode != InputRequest.Mode.FORM:
        return None
    try:
        return answer_form(ir.form_schema, tz=request.POST.get(TZ_FIELD, ""), data=request.POST)
    except schema_forms.UnsupportedSchema:
        return None


def _with_call_link(message: str, ir: InputRequest) -> str:
    """The queue's confirmation of a decision, with the way to the call: what the server does with the
    answer (its progress, its result) shows there. Server-named text in `message` is escaped here, its
    invisible and direction-changing characters shown as codes, as on every page."""
    url = reverse("approvals:call", args=[ir.round.call_id])
    return format_html('{} <a href="{}" data-follow-call>{}</a>', reveal(message), url, _("Follow the call"))


def _sent_message(ir: InputRequest) -> str:
    call = ir.round.call
    values = {"server": call.server_name, "tool": call.tool, "key": ir.key}
    if ir.status == InputRequest.Status.PENDING:  # one approval of several: recorded, nothing sent yet
        return _("Your approval of “%(key)s” is recorded; another reviewer must confirm it.") % values
    if ir.action == InputRequest.Action.ACCEPT:
        return _("Approved “%(key)s”: sent to %(server)s, which continues %(tool)s.") % values
    if ir.action == InputRequest.Action.DECLINE:
        return _("Declined “%(key)s”: %(server)s is told no.") % values
    return _("Dismissed “%(key)s” without deciding.") % values


class SignInView(LoginView):
    """Django's sign-in page; a throttled sign-in (approvals.throttling) is answered 429 with the wait."""

    def form_invalid(self, form: Any) -> HttpResponse:
        wait = getattr(self.request, throttling.RETRY_AFTER, None)
        if not wait:
            return super().form_invalid(form)
        context = self.get_context_data(form=form, retry_message=throttling.too_many_attempts(wait))
        return throttling.refused(self.render_to_response(context), wait)
