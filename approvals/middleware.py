"""Request bodies over the hub's limit: answered 413 before any view or form reads them.

Django refuses a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (set to ``ELICIT_MAX_BODY``) when it is first
read, with a bare 400 (a traceback page with DEBUG on). Reading it here, first, turns that into the hub's own
answers: the JSON error shape under /api/, a readable page elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views import defaults

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def too_large_error(limit: int) -> dict[str, dict[str, str]]:
    """The API's 413 body (also the web server's own, `elicit_hub.serve`, which refuses as bodies arrive)."""
    message = f"The request body is larger than {limit} bytes, the most the hub accepts."
    return {"error": {"code": "body_too_large", "message": message}}


def too_large(request: HttpRequest) -> HttpResponse:
    limit = settings.ELICIT_MAX_BODY
    if request.path.startswith("/api/"):
        return JsonResponse(too_large_error(limit), status=413)
    return render(request, "413.html", {"limit": limit}, status=413)


class BodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in SAFE_METHODS:
            try:
                request.body  # noqa: B018  (read now: Django checks the size on the first read)
            except RequestDataTooBig:
                return too_large(request)
        return self.get_response(request)


class HeadMiddleware:
    """``HEAD`` on every ``GET`` address, answered as the ``GET`` would be: its status and headers
    (``Content-Length`` the ``GET`` body's, ``Inbox-Version``, ``ETag``-like versions) without the body (RFC
    9110 9.3.2: a server that answers ``GET`` answers ``HEAD``). django-ninja routes by method, and the
    dashboard's views take ``GET`` alone (``require_GET``): both answered 405, to monitors and link checkers
    too. A streamed answer (an export) is left unread."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method != "HEAD":
            return self.get_response(request)
        request.method = "GET"
        try:
            response = self.get_response(request)
        finally:
            request.method = "HEAD"
        if isinstance(response, StreamingHttpResponse):
            # Never read, so never produced (an export); the response itself is closed as usual, later.
            response.streaming_content = []
        else:
            response["Content-Length"] = str(len(response.content))
            response.content = b""
        return response


class ErrorShapeMiddleware:
    """A 404 or 405 that Django or django-ninja answered on their own (no route; a method the route does not
    take): the API's JSON error shape under /api/, and a readable page elsewhere, where Django's 405 is an
    empty body. A 405 keeps its ``Allow`` header."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code not in (404, 405) or response.streaming:
            return response
        allowed = [method.strip() for method in response.get("Allow", "").split(",") if method.strip()]
        if "GET" in allowed and "HEAD" not in allowed:
            allowed.append("HEAD")  # HeadMiddleware answers it
        if request.path.startswith("/api/"):
            if response.get("Content-Type", "").startswith("application/json"):
                return response  # the API's own error
            error = api_error(request, response.status_code, allowed)
            shaped: HttpResponse = JsonResponse(error, status=response.status_code)
        elif response.status_code == 405:
            shaped = render(request, "405.html", {"method": request.method}, status=405)
        else:
            return response  # Django's 404 is the 404.html page already
        if response.has_header("Allow"):
            shaped["Allow"] = ", ".join(allowed)
        return shaped


def api_error(request: HttpRequest, status: int, allowed: list[str]) -> dict[str, dict[str, str]]:
    """The API's 404 or 405 body; a 405's message names the methods its ``Allow`` header lists."""
    if status == 404:
        return {"error": {"code": "not_found", "message": "Not found."}}
    listed = ", ".join(allowed)
    message = f"{request.method} is not allowed here" + (f"; allowed: {listed}." if listed else ".")
    return {"error": {"code": "method_not_allowed", "message": message}}


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: a request Django refused before any view (a Host not in ALLOWED_HOSTS, a suspicious
    operation in a middleware) gets the API's JSON error shape under /api/, the 400 page elsewhere."""
    if request.path.startswith("/api/"):
        message = "The request was refused as malformed (for example, a Host header this hub does not serve)."
        return JsonResponse({"error": {"code": "invalid_request", "message": message}}, status=400)
    return defaults.bad_request(request, exception)
