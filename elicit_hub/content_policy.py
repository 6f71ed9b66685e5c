"""The Content-Security-Policy (django-csp), plus the dashboard's own websocket origin in connect-src.

The policy itself lives in settings (CONTENT_SECURITY_POLICY). Browsers differ on whether 'self' covers
ws:/wss: of the same host, so each response names its host's websocket origin explicitly; a host that did not
pass ALLOWED_HOSTS (a 400) gets none.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase


class HubCSPMiddleware(CSPMiddleware):
    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only:
            try:
                host = request.get_host()
            except DisallowedHost:
                # The 400 answering a Host not in ALLOWED_HOSTS: it keeps the rest of the policy, and names
                # no websocket origin (raising here would replace that answer with another, policy-less).
                return parts
            socket = f"{'wss' if request.is_secure() else 'ws'}://{host}"
            update = dict(parts.update or {})
            update["connect-src"] = [*update.get("connect-src", []), socket]
            parts.update = update
        return parts
