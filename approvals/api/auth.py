"""Bearer tokens (agents, reviewers' scripts) and the browser session, for the API."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest
from ninja.errors import Throttled
from ninja.security import HttpBearer, SessionAuth

from approvals import permissions
from approvals.models import AgentClient, PersonalToken
from approvals.ratelimit import AnonymousRateThrottle, TokenRateThrottle
from approvals.services import tokens
from approvals.services.errors import Forbidden


class AgentRequest(HttpRequest):
    """The request an ``agent_auth`` endpoint receives: django-ninja sets ``auth`` to the agent."""

    auth: AgentClient


def bearer_token(request: HttpRequest) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (the scheme in any case, one or more spaces before the
    token), or None."""
    return tokens.bearer(request.headers.get("Authorization", ""))


# Set on a request its browser session let in (`ReviewerSession`): an Authorization header it also carries
# was not its credential.
_BY_SESSION = "_elicit_by_session"


def still_holds(request: HttpRequest) -> bool:
    """Whether the credential `request` was let in with still holds, read again: after a long-poll's wait
    (up to a minute), a token deleted, an agent or a user deactivated or a session signed out meanwhile is
    not answered. A reviewer's token read again brings their teams with it (`tokens.authenticate`), so the
    reads after the wait need no statement of their own for them."""
    token = None if getattr(request, _BY_SESSION, False) else bearer_token(request)
    if token is not None:
        found = tokens.authenticate(token)
        if isinstance(found, AgentClient):
            return found.pk == getattr(request.auth, "pk", None)  # type: ignore[attr-defined]
        if isinstance(found, PersonalToken) and found.user_id == request.user.pk:
            request.user = found.user
            return True
        return False
    key = request.session.session_key if hasattr(request, "session") else None
    if key is None:
        return False
    # The session and its user read afresh, as at sign-in: gone, deactivated or a password changed since.
    user = get_user(SimpleNamespace(session=request.session.__class__(key)))  # type: ignore[arg-type]
    return bool(user.is_authenticated and user.pk == request.user.pk)


def _token(request: HttpRequest, token: str) -> AgentClient | PersonalToken | None:
    """What `token` is (`tokens.authenticate`), read once per request: every credential of an endpoint's
    list, and `WrongKind` after them, ask."""
    cached = getattr(request, "_elicit_token", None)
    if cached is not None and cached[0] == token:
        return cached[1]
    found = tokens.authenticate(token)
    request._elicit_token = (token, found)  # type: ignore[attr-defined]
    return found


class Bearer(HttpBearer):
    """``Authorization: Bearer <token>``: the scheme in any case, one or more spaces before the token (RFC
    7235). django-ninja's own parsing logged the whole header, token included, whenever the scheme was
    another (``Token eha_...``, with DEBUG on), and took a second space as the token's first character."""

    def __call__(self, request: HttpRequest) -> Any:
        token = bearer_token(request)
        return None if token is None else self.authenticate(request, token)


class AgentToken(Bearer):
    openapi_description = "An agent token from `manage.py create_agent`."

    def authenticate(self, request: HttpRequest, token: str) -> AgentClient | None:
        found = _token(request, token)
        return found if isinstance(found, AgentClient) else None


class ReviewerToken(Bearer):
    openapi_description = "A personal token from `manage.py create_token`; acts as that user."

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = _token(request, token)
        if isinstance(found, PersonalToken):
            request.user = found.user
            return found.user
        return None


class ReviewerSession(SessionAuth):
    """The dashboard's Django session; CSRF is enforced on unsafe methods of a signed-in session."""

    def _get_key(self, request: HttpRequest) -> str | None:
        # django-ninja checks CSRF before it looks for a session at all, so a script's POST with a revoked
        # token, an agent's token or none would get 403 "CSRF check Failed" instead of its 401 or
        # `wrong_token_kind`, and escape the anonymous rate limit. Without a signed-in session there is
        # nothing for a forged request to ride on, so no check to make.
        if not request.user.is_authenticated:
            return None
        return super()._get_key(request)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        user = super().authenticate(request, key)
        if not (user and user.is_authenticated):
            return None
        permissions.remember_session(request)  # a policy's recent sign-in is this session's
        setattr(request, _BY_SESSION, True)
        return user


def _count_on_token(request: HttpRequest, credential: AgentClient | Any) -> None:
    """A request of a valid token that an endpoint refuses for its kind counts on that token's limit
    (ELICIT_API_RATE, the counter the API's own throttle keeps for the agent or user) as its other requests
    do; otherwise it falls between that limit, which only a matched credential reaches, and the anonymous
    one. Past the limit: 429, with Retry-After."""
    throttle = TokenRateThrottle(settings.ELICIT_API_RATE)
    request.auth = credential  # type: ignore[attr-defined]  # the throttle's key; no credential matched
    try:
        allowed = throttle.allow_request(request)
    finally:
        del request.auth  # type: ignore[attr-defined]
    if not allowed:
        raise Throttled(wait=throttle.wait())  # type: ignore[arg-type]


class WrongKind:
    """After the credentials an endpoint takes: a valid token of the other kind (an agent's token on a
    reviewer's endpoint, a reviewer's personal token on an agent's) is refused 403 ``wrong_token_kind``,
    saying which token the endpoint takes, not the 401 of a token the hub does not know (which sends a
    client to renew a token that is fine). Reached only when no credential the endpoint takes matched."""

    def __init__(self, wanted: type[AgentClient] | type[PersonalToken]) -> None:
        self.wanted = wanted

    def __call__(self, request: HttpRequest) -> None:
        token = bearer_token(request)
        found = _token(request, token) if token is not None else None
        if isinstance(found, (AgentClient, PersonalToken)) and not isinstance(found, self.wanted):
            _count_on_token(request, found if isinstance(found, AgentClient) else found.user)
        if isinstance(found, AgentClient) and self.wanted is PersonalToken:
            raise Forbidden(
                "This is an agent's token; this endpoint is a reviewer's: use a personal token (manage.py "
                "create_token) or a signed-in session.",
                code="wrong_token_kind",
            )
        if isinstance(found, PersonalToken) and self.wanted is AgentClient:
            raise Forbidden(
                "This is a reviewer's personal token; this endpoint is an agent's: use the agent's token "
                "(manage.py create_agent).",
                code="wrong_token_kind",
            )
        return None


class AnonymousLimit:
    """Last in every auth list, so reached only when no credential matched: counts anonymous requests per
    client address on the API's limiter and refuses them past ELICIT_API_ANON_RATE (429, Retry-After);
    otherwise the request goes on to the usual 401."""

    def __call__(self, request: HttpRequest) -> None:
        throttle = AnonymousRateThrottle(settings.ELICIT_API_ANON_RATE)
        if not throttle.allow_request(request):
            raise Throttled(wait=throttle.wait())  # type: ignore[arg-type]
        return None


agent_auth = [AgentToken(), WrongKind(AgentClient), AnonymousLimit()]
reviewer_auth = [ReviewerToken(), ReviewerSession(), WrongKind(PersonalToken), AnonymousLimit()]
agent_or_reviewer_auth = [AgentToken(), ReviewerToken(), ReviewerSession(), AnonymousLimit()]
