"""The grants pages: every grant of the user's teams (filtered), and revoking one after a confirmation.

Thin like approvals.views: parse the filters, fetch through the permission-scoped listing, call one service.
Like the dashboard's pages, none is kept by the browser (``never_cache``): Back after revoking reads the grant
again instead of offering to revoke it once more, and a browser signed out keeps no copy of the list.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import TextField
from django.db.models.functions import Cast, Left
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from approvals import permissions, safejson
from approvals.models import Grant
from approvals.services import grants
from approvals.services.errors import ServiceError
from approvals.templatetags.approvals_ui import pretty_json, reveal

PAGE_MAX = 500
# Characters of an exact grant's arguments the list shows (the approved call, one click away, shows them
# whole): arguments may be as large as a call's body, and a page holds up to PAGE_MAX grants.
ARGUMENTS_SHOWN = 1200


def _filters(request: HttpRequest) -> grants.Filters:
    def text(name: str, limit: int) -> str:
        value = request.GET.get(name, "")
        # No slug, name or tool is longer than its limit or holds a NUL (PostgreSQL refuses it in a query):
        # such a filter matches nothing (cut to the limit, it could name another tool and show its grants).
        return value if len(value) <= limit and not safejson.text_problem(value) else "\ufffd"

    state = request.GET.get("state", "active")
    return grants.Filters(
        state=state if state in grants.STATES else "",
        team=text("team", 50),
        agent=text("agent", 120),
        tool=text("tool", 200),
    )


def _get_grant_for_user(user: Any, pk: UUID) -> Grant:
    grant = grants.listing(user=user).filter(pk=pk).first()
    if grant is None:
        raise Http404(_("No such grant."))
    return grant


def _shown_arguments(found: list[Grant]) -> None:
    """Set ``arguments_shown`` on each exact grant of the list: its arguments as JSON, cut short (and
    ``arguments_cut``) past ARGUMENTS_SHOWN characters. Read from ``arguments_text``, the start of their text
    as the database holds it, so that no page reads every grant's arguments whole."""
    for grant in found:
        if grant.arguments_mode != Grant.Arguments.EXACT:
            continue
        text = getattr(grant, "arguments_text", None)
        if text is not None and len(text) > ARGUMENTS_SHOWN:
            grant.arguments_shown = text[:ARGUMENTS_SHOWN] + "\u2026"  # type: ignore[attr-defined]
            grant.arguments_cut = True  # type: ignore[attr-defined]
        else:
            grant.arguments_shown = pretty_json(json.loads(text) if text is not None else None)  # type: ignore[attr-defined]


def _revocable(user: Any, found: list[Grant]) -> set[UUID]:
    """The grants on the page this user may revoke (``permissions.can_revoke_grant``, in one query)."""
    if user.is_superuser:
        return {grant.pk for grant in found}
    teams = set(permissions.answering_team_ids(user))
    return {grant.pk for grant in found if grant.team_id in teams}


@login_required
@never_cache
@require_http_methods(["GET"])
def grant_list(request: HttpRequest) -> HttpResponse:
    filters = _filters(request)
    listed = (
        grants.listing(user=request.user, filters=filters)
        .defer("arguments")
        .annotate(arguments_text=Left(Cast("arguments", TextField()), ARGUMENTS_SHOWN + 1))
    )
    found = list(listed[: PAGE_MAX + 1])
    _shown_arguments(found)
    # The filters' choices: each distinct value once, read in the database, not a row per grant ever made.
    visible = grants.listing(user=request.user).order_by()

    def choices(field: str) -> list[str]:
        return list(visible.values_list(field, flat=True).distinct().order_by(field))

    context = {
        "grants": found[:PAGE_MAX],
        "more": len(found) > PAGE_MAX,
        "filters": filters,
        "states": [
            ("active", _("Active")),
            ("expired", _("Expired")),
            ("revoked", _("Revoked")),
            ("", _("All")),
        ],
        "teams": choices("team__slug"),
        "agents": choices("agent__name"),
        "tools": choices("tool"),
        "now": timezone.now(),
        "revocable": _revocable(request.user, found),
        # The grants whose grantor could not make them now: they let nothing through.
        "grantor_gone": {grant.pk for grant in found if not getattr(grant, "grantor_stands", True)},
    }
    return render(request, "approvals/grants.html", context)


@login_required
@never_cache
@require_http_methods(["GET", "POST"])
def grant_revoke(request: HttpRequest, pk: UUID) -> HttpResponse:
    """GET: what revoking will do, and the button. POST: revoke, then back to the list. A POST refused (a
    viewer's, or for another team's grant) is recorded (``grants.refuse``)."""
    if request.method == "POST":
        found = grants.for_revoke(grant_id=pk, user=request.user)
        if found is None:
            raise Http404(_("No such grant."))
        grant = found
    else:
        grant = _get_grant_for_user(request.user, pk)
    context: dict[str, Any] = {"grant": grant, "now": timezone.now(), "error": "", "notice": ""}
    context["may_revoke"] = permissions.can_revoke_grant(request.user, grant)
    context["grantor_gone"] = grants.grantor_gone(grant)
    if request.method == "GET":
        return render(request, "approvals/grant_revoke.html", context)
    try:
        grants.revoke(grant=grant, by=request.user)
    except ServiceError as exc:
        grant.refresh_from_db()
        context.update(
            grant=grant, **({"notice": exc.message} if exc.status == 409 else {"error": exc.message})
        )
        return render(request, "approvals/grant_revoke.html", context, status=exc.status)
    # The tool's name is the agent's: escaped, its invisible and direction-changing characters shown as codes.
    revoked = _("Revoked the grant for %(agent)s on %(tool)s: its next call stops for a person.")
    messages.success(request, reveal(revoked % {"agent": grant.agent.name, "tool": grant.tool}))
    return redirect("approvals:grants")
