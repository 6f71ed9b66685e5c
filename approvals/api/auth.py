"""Bearer tokens (agents, reviewers' scripts) and the browser session, for the API."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.errors import Throttled
from ninja.security import HttpBearer, SessionAuth

from approvals.models import AgentClient, PersonalToken
from approvals.ratelimit import AnonymousRateThrottle
from approvals.services import tokens


class AgentRequest(HttpRequest):
    """The request an ``agent_auth`` endpoint receives: django-ninja sets ``auth`` to the agent."""

    auth: AgentClient


class Bearer(HttpBearer):
    """``Authorization: Bearer <token>``: the scheme in any case, one or more spaces before the token (RFC
    7235). django-ninja's own parsing logged the whole header, token included, whenever the scheme was
    another (``Token eha_...``, with DEBUG on), and took a second space as the token's first character."""

    def __call__(self, request: HttpRequest) -> Any:
        scheme, _, token = request.headers.get(self.header, "").partition(" ")
        token = token.lstrip(" ")
        if scheme.lower() != self.openapi_scheme or not token:
            return None
        return self.authenticate(request, token)


class AgentToken(Bearer):
    openapi_description = "An agent token from `manage.py create_agent`."

    def authenticate(self, request: HttpRequest, token: str) -> AgentClient | None:
        found = tokens.authenticate(token)
        return found if isinstance(found, AgentClient) else None


class ReviewerToken(Bearer):
    openapi_description = "A personal token from `manage.py create_token`; acts as that user."

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = tokens.authenticate(token)
        if isinstance(found, PersonalToken):
            request.user = found.user
            return found.user
        return None


class ReviewerSession(SessionAuth):
    """The dashboard's Django session; CSRF is enforced on unsafe methods."""

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        user = super().authenticate(request, key)
        return user if user and user.is_authenticated else None


class AnonymousLimit:
    """Last in every auth list, so reached only when no credential matched: counts anonymous requests per
    client address on the API's limiter and refuses them past ELICIT_API_ANON_RATE (429, Retry-After);
    otherwise the request goes on to the usual 401."""

    def __call__(self, request: HttpRequest) -> None:
        throttle = AnonymousRateThrottle(settings.ELICIT_API_ANON_RATE)
        if not throttle.allow_request(request):
            raise Throttled(wait=throttle.wait())  # type: ignore[arg-type]
        return None


agent_auth = [AgentToken(), AnonymousLimit()]
reviewer_auth = [ReviewerToken(), ReviewerSession(), AnonymousLimit()]
agent_or_reviewer_auth = [AgentToken(), ReviewerToken(), ReviewerSession(), AnonymousLimit()]
