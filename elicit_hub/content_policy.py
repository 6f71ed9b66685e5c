"""The Content-Security-Policy (django-csp), plus the dashboard's own websocket origin in connect-src.

The policy itself lives in settings (CONTENT_SECURITY_POLICY). Browsers differ on whether 'self' covers
ws:/wss: of the same host, so each response names its host's websocket origin explicitly; the host has
passed ALLOWED_HOSTS by then.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.http import HttpRequest, HttpResponseBase


class HubCSPMiddleware(CSPMiddleware):
    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only:
            socket = f"{'wss' if request.is_secure() else 'ws'}://{request.get_host()}"
            update = dict(parts.update or {})
            update["connect-src"] = [*update.get("connect-src", []), socket]
            parts.update = update
        return parts
