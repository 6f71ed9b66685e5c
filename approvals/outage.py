"""While an engine (PostgreSQL or Redis) is down: 503 with Retry-After, never a 500, nothing stored half-way.

- The API answers ``{"error": {"code": "engine_unavailable", ...}}`` (handlers installed on the NinjaAPI); so
  does the MCP gateway (``approvals.gateway.server.Guard``).
- Dashboard pages get the readable ``503.html`` (``OutageMiddleware``, and ``handler500`` for faults raised
  outside a view): a page reloads itself, a refused form says to send it again.
- Writes need both engines: a write's side effects (Celery tasks, live notices) go through Redis after its
  transaction commits, so an unsafe request first checks that Redis takes a write, and while it does not
  (unreachable, or out of memory, read-only, unable to save), is refused before anything is stored. Reads
  need only PostgreSQL, and so does signing out.
- The API's rate limits are kept in Redis; while Redis is away or refuses writes they are counted in each
  process's memory (``approvals.ratelimit``), so they neither fail the request nor stop limiting.
- Redis "down" includes a Redis that answers but refuses writes (``REDIS_ERRORS``, ``REDIS_REFUSALS``), and
  PostgreSQL "down" a server that takes no writes (a standby after a failover).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import redis.exceptions
from django.core.cache import cache
from django.db import InternalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.csrf import requires_csrf_token
from ninja import NinjaAPI

from approvals.faults import (  # noqa: F401  (part of this module's interface)
    DATABASE_ERRORS,
    ENGINE_ERRORS,
    REDIS_ERRORS,
    REDIS_REFUSALS,
    EngineUnavailable,
    engine_of,
)

logger = logging.getLogger(__name__)

# Seconds a client is told to wait before trying again.
RETRY_AFTER = 5
API_PREFIX = "/api/"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}


def _named(exc: BaseException | type[BaseException]) -> str:
    """The error's class, and the driver's beneath Django's (``OperationalError: DeadlockDetected``): which
    of the engine's faults it was, without its message (which may quote values)."""
    if isinstance(exc, type):
        return exc.__name__
    cause = exc.__cause__
    if cause is not None and type(cause).__name__ != type(exc).__name__:
        return f"{type(exc).__name__}: {type(cause).__name__}"
    return type(exc).__name__


def error_body(engine: str) -> dict[str, Any]:
    """The JSON error of a 503 for `engine` down (the API's, and the MCP gateway's)."""
    return {
        "error": {
            "code": "engine_unavailable",
            "message": f"The hub's {'database' if engine == 'postgresql' else 'queue'} is unavailable; "
            f"nothing was stored. Retry after {RETRY_AFTER} seconds.",
        }
    }


def api_response(engine: str) -> HttpResponse:
    response = JsonResponse(error_body(engine), status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


def page_response(request: HttpRequest) -> HttpResponse:
    """The readable 503. A page reloads itself; a refused form does not: a reload is a GET, which would drop
    what was typed while the page said the hub tries again, so it says to go back and send it again."""
    # Rendered without a context processor or the user: the engines behind them are what is down.
    context = {"retry_after": RETRY_AFTER, "sent": request.method not in SAFE_METHODS}
    response = HttpResponse(render_to_string("503.html", context), status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


def install(api: NinjaAPI) -> None:
    """Answer engine faults in the API with a JSON 503. An error of the same classes that is no outage (a
    limit of PostgreSQL's own, an internal error other than a read-only server's) goes on to the handler the
    API has for its class's bases (its JSON 500), as a dashboard page's goes on to the 500 page."""

    def on_engine_error(request: HttpRequest, exc: Exception | type[Exception]) -> HttpResponse:
        engine = engine_of(exc)
        if engine is None:
            handlers: dict[type[Exception], Any] = api._exception_handlers
            for cls in exc.__mro__ if isinstance(exc, type) else type(exc).__mro__:
                handler = handlers.get(cls)
                if handler is not None and handler is not on_engine_error:
                    return handler(request, exc)
            raise exc
        logger.warning("API %s %s: %s unavailable (%s)", request.method, request.path, engine, _named(exc))
        return api_response(engine)

    for error in (*ENGINE_ERRORS, InternalError, redis.exceptions.ResponseError):
        api.add_exception_handler(error, on_engine_error)


def redis_answers() -> bool:
    """Whether Redis takes writes now: one small write, which a Redis that is out of memory, read-only or
    unable to save (MISCONF) refuses while it still answers PING."""
    key = cache.make_and_validate_key("outage-probe")
    refused: tuple[type[Exception], ...] = (*REDIS_ERRORS, redis.exceptions.ResponseError)  # any refusal
    try:
        client = cache._cache.get_client(key, write=True)  # type: ignore[attr-defined]
        return bool(client.set(key, b"1", ex=60))
    except refused:
        return False


@functools.cache
def sign_outs() -> frozenset[str]:
    """The sign-out addresses (the dashboard's, the admin's): a write that needs only PostgreSQL (the
    session's row; moving the sockets' counter is best effort), which a Redis outage must not hold up."""
    return frozenset({reverse("logout"), reverse("admin:logout")})


class OutageMiddleware:
    """Refuse a write while Redis is down (before anything is stored); turn an engine fault in a view into
    a 503: JSON under /api/, the readable page elsewhere."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in SAFE_METHODS and request.path not in sign_outs() and not redis_answers():
            logger.warning("%s %s refused: Redis unavailable", request.method, request.path)
            return self._respond(request, "redis")
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        engine = engine_of(exc)
        if engine is None:
            return None
        logger.warning("%s %s: %s unavailable (%s)", request.method, request.path, engine, _named(exc))
        return self._respond(request, engine)

    @staticmethod
    def _respond(request: HttpRequest, engine: str) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            return api_response(engine)
        return page_response(request)


@requires_csrf_token
def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: a fault outside a view (e.g. in a middleware) that is an engine outage is still a 503; any
    other is the API's JSON 500 under /api/, the 500 page elsewhere."""
    engine = engine_of(sys.exc_info()[1])
    if engine is not None:
        return OutageMiddleware._respond(request, engine)
    if request.path.startswith(API_PREFIX):
        # The API's error shape, whatever failed: a client reads JSON, never the page.
        message = "The hub failed to handle this request; the fault is logged."
        return JsonResponse({"error": {"code": "internal_error", "message": message}}, status=500)
    return HttpResponse(render_to_string("500.html"), status=500)
