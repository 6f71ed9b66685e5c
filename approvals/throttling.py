"""Sign-in throttling on the API's own limiter (django-ninja's SimpleRateThrottle over the Redis cache).

Failed sign-ins are counted per user name and per client address; past either limit every sign-in for
that name or from that address is refused, the right password included, until the oldest counted failure
leaves the window. The check is in the authentication backend, so the dashboard's sign-in page and the
admin's are both covered.
Anonymous API requests are limited in approvals.api.auth with the same limiter.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import PermissionDenied, ValidationError
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.utils.translation import ngettext
from ninja.throttling import SimpleRateThrottle

# Set on the request when a sign-in was refused unheard: seconds until the next attempt may count.
RETRY_AFTER = "sign_in_retry_after"


class FailureThrottle(SimpleRateThrottle):
    """Counts failures only: ``retry_after`` looks without counting, ``failed`` counts one. Keyed by the
    user name when given, else by the client's address (as the API's throttles find it)."""

    def __init__(self, scope: str, rate: str, username: str | None = None) -> None:
        self.scope = scope
        self.username = username
        super().__init__(rate)

    def get_cache_key(self, request: HttpRequest) -> str:
        ident = self.username if self.username is not None else (self.get_ident(request) or "")
        digest = hashlib.sha256(ident.encode()).hexdigest()  # names and addresses stay out of Redis
        return self.cache_format % {"scope": self.scope, "ident": digest}

    def _load(self, request: HttpRequest) -> None:
        self.key = self.get_cache_key(request)
        self.history = self.cache.get(self.key, [])
        self.now = time.time()
        while self.history and self.history[-1] <= self.now - self.duration:  # type: ignore[operator]
            self.history.pop()

    def retry_after(self, request: HttpRequest) -> float | None:
        """Seconds until an attempt may be made again, or None when one may be made now."""
        self._load(request)
        if len(self.history) < self.num_requests:  # type: ignore[operator]
            return None
        return self.wait() or float(self.duration)  # type: ignore[arg-type]

    def failed(self, request: HttpRequest) -> None:
        self._load(request)
        self.throttle_success()  # records this failure in the window


def sign_in_throttles(request: HttpRequest, username: Any) -> list[FailureThrottle]:
    throttles = [FailureThrottle("sign-in-client", settings.ELICIT_SIGN_IN_CLIENT_RATE)]
    if username:
        name = str(username).casefold()
        throttles.append(FailureThrottle("sign-in-user", settings.ELICIT_SIGN_IN_USER_RATE, name))
    return throttles


def sign_in_retry_after(request: HttpRequest, username: Any) -> float | None:
    waits = [wait for t in sign_in_throttles(request, username) if (wait := t.retry_after(request))]
    return max(waits, default=None)


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
    even checked."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kw: Any
    ) -> Any:
        if request is not None:  # None: not a sign-in over HTTP (e.g. a management command)
            wait = sign_in_retry_after(request, username if username is not None else kw.get("email"))
            if wait:
                setattr(request, RETRY_AFTER, wait)
                raise PermissionDenied
        return super().authenticate(request, username=username, password=password, **kw)


@receiver(user_login_failed, dispatch_uid="approvals.throttling.count_failure")
def count_failure(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kw: Any
) -> None:
    if request is None or getattr(request, RETRY_AFTER, None):
        return  # refused unheard: not another failure
    for throttle in sign_in_throttles(request, credentials.get("username")):
        throttle.failed(request)
