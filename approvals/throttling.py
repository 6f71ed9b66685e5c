"""Sign-in throttling, on the Redis cache the API's limiter uses.

Failed sign-ins are counted per user name and per client address; past either limit every sign-in for
that name or from that address is refused, the right password included, until the oldest counted failure
leaves the window. The check is in the authentication backend, so the dashboard's sign-in page and the
admin's are both covered.

An attempt is counted before its password is checked, atomically with reading the count, and taken off
again when the password was right: read first and counted after the check, a burst of concurrent guesses
all passed the check before any of their failures was known, however low the limit.
Anonymous API requests are limited in approvals.api.auth with the API's limiter (approvals.ratelimit).
"""

from __future__ import annotations

import functools
import hashlib
import math
import secrets
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.utils.translation import ngettext
from ninja.throttling import SimpleRateThrottle

from approvals.ratelimit import client_network

# Set on the request when a sign-in was refused unheard: seconds until the next attempt may count.
RETRY_AFTER = "sign_in_retry_after"


class FailureThrottle(SimpleRateThrottle):
    """The attempts of one user name (when given) or one client address (its network, as the API's limits
    count it) in the last period: a sorted set in Redis of attempt ids by time. ``begin`` adds one and
    counts in one transaction, so of concurrent attempts only as many as the limit allows get in."""

    cache_format = "sign_in_%(scope)s_%(ident)s"  # a sorted set (the former list lived under throttle_*)

    def __init__(self, scope: str, rate: str, username: str | None = None) -> None:
        self.scope = scope
        self.username = username
        super().__init__(rate)
        self.limit, self.period = self.num_requests or 0, self.duration or 0  # `rate` is given: never None

    def get_ident(self, request: HttpRequest) -> str | None:
        return client_network(super().get_ident(request))

    def get_cache_key(self, request: HttpRequest) -> str:
        ident = self.username if self.username is not None else (self.get_ident(request) or "")
        digest = hashlib.sha256(ident.encode()).hexdigest()  # names and addresses stay out of Redis
        return self.cache_format % {"scope": self.scope, "ident": digest}

    def begin(self, request: HttpRequest) -> None:
        """Count an attempt now. Past the limit it is taken off again at once, and ``self.refused_for`` is the
        seconds until one more may be made; otherwise ``self.refused_for`` is None."""
        store: Any = self.cache
        self.key = store.make_and_validate_key(self.get_cache_key(request))
        self.client = store._cache.get_client(self.key, write=True)
        self.attempt = secrets.token_hex(8)
        now = self.timer()  # type: ignore[misc]  # ninja keeps time.time as a class attribute
        pipe = self.client.pipeline(transaction=True)
        pipe.zremrangebyscore(self.key, "-inf", now - self.period)
        pipe.zadd(self.key, {self.attempt: now})
        pipe.expire(self.key, self.period + 1)
        pipe.zrange(self.key, 0, -1, withscores=True)
        *_, log = pipe.execute()
        earlier = [at for attempt, at in log if attempt != self.attempt.encode()]
        self.refused_for: float | None = None
        if len(earlier) >= self.limit:
            self.end()
            # One more fits once all but `limit - 1` of the earlier attempts are a period old.
            self.refused_for = max(1.0, earlier[len(earlier) - self.limit] + self.period - now)

    def end(self) -> None:
        """Take this attempt off the count: the password was right, or the attempt was refused."""
        self.client.zrem(self.key, self.attempt)


def sign_in_throttles(request: HttpRequest, username: Any) -> list[FailureThrottle]:
    throttles = [FailureThrottle("sign-in-client", settings.ELICIT_SIGN_IN_CLIENT_RATE)]
    if username:
        name = str(username).casefold()
        throttles.append(FailureThrottle("sign-in-user", settings.ELICIT_SIGN_IN_USER_RATE, name))
    return throttles


def sign_in_begin(request: HttpRequest, username: Any) -> list[FailureThrottle]:
    """The attempt, counted for its client and its user name; refused (PermissionDenied, with the wait set
    on the request as ``RETRY_AFTER``, and counted nowhere) when either is past its limit."""
    throttles = sign_in_throttles(request, username)
    for throttle in throttles:
        throttle.begin(request)
    waits = [throttle.refused_for for throttle in throttles if throttle.refused_for is not None]
    if waits:
        sign_in_end([throttle for throttle in throttles if throttle.refused_for is None])
        setattr(request, RETRY_AFTER, max(waits))
        raise PermissionDenied
    return throttles


def sign_in_end(throttles: list[FailureThrottle]) -> None:
    """Take the attempt off the counts again: it was not a failure."""
    for throttle in throttles:
        throttle.end()


def minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


def too_many_attempts(seconds: float) -> str:
    count = minutes(seconds)
    return ngettext(
        "Too many attempts, try again in %(count)d minute.",
        "Too many attempts, try again in %(count)d minutes.",
        count,
    ) % {"count": count}


class ThrottledAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin's sign-in form, saying why a throttled sign-in was refused."""

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            wait = getattr(self.request, RETRY_AFTER, None)
            if wait:
                raise ValidationError(too_many_attempts(wait), code="throttled") from None
            raise


def refused(response: HttpResponse, wait: float) -> HttpResponse:
    """Mark a sign-in page's answer as throttled: 429, and when to try again."""
    response.status_code = 429
    response["Retry-After"] = str(math.ceil(wait))
    return response


def answer_throttled_with_429(login: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap the admin's sign-in view: a throttled sign-in is answered 429 with ``Retry-After``, as the site's
    own sign-in page is (the form says why; Django's view answered 200)."""

    @functools.wraps(login)
    def view(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = login(request, extra_context)
        wait = getattr(request, RETRY_AFTER, None)
        if wait and request.method == "POST" and response.status_code == 200:
            refused(response, wait)
        return response

    return view


class ThrottledModelBackend(ModelBackend):
    """Django's own backend, refusing any sign-in for a throttled name or client before the password is
    even checked, and counting the attempt as a failure unless the password was right."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kw: Any
    ) -> Any:
        if request is None:  # not a sign-in over HTTP (e.g. a management command)
            return super().authenticate(request, username=username, password=password, **kw)
        throttles = sign_in_begin(request, username if username is not None else kw.get("email"))
        try:
            user = super().authenticate(request, username=username, password=password, **kw)
        except Exception:  # the hub's fault (the database went away), not the caller's: not counted
            sign_in_end(throttles)
            raise
        if user is not None:  # the right password: not a failure
            sign_in_end(throttles)
        return user
