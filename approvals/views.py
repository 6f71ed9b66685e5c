"""Dashboard views: thin; parse, fetch through a permission-checking helper, call one service, render."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from approvals import selectors


@login_required
def queue(request: HttpRequest) -> HttpResponse:
    items = list(selectors.inbox(request.user))
    return render(request, "approvals/queue.html", {"items": items})
