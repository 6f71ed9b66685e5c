"""The Content-Security-Policy in a real browser (Chromium on Daphne): the dashboard's script, its live
websocket, the admin and the API docs page all work under it, and the browser reports no violation."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import Membership
from tests import factories
from tests.browser.conftest import wait_live

pytestmark = pytest.mark.timeout(120)

WATCH_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


def watch(page: Any) -> list[str]:
    """Violations seen by the page's own listener and in the console, across navigations."""
    console: list[str] = []
    page.add_init_script(WATCH_VIOLATIONS)
    page.on(
        "console",
        lambda message: console.append(message.text) if "Content Security Policy" in message.text else None,
    )
    return console


def violations(page: Any, console: list[str]) -> list[str]:
    return [*page.evaluate("window.__violations || []"), *console]


def test_the_dashboard_runs_under_the_policy_without_a_violation(web, new_page) -> None:
    alice = factories.user("alice", is_staff=True, is_superuser=True)
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    ir = factories.open_round(factories.call(deploy, agent), team_=release).input_requests.get()

    page = new_page("alice")
    console = watch(page)
    page.reload()
    assert "default-src 'self'" in page.evaluate(
        "fetch(location.href).then((r) => r.headers.get('content-security-policy'))"
    )
    # app.js ran: the websocket (connect-src) is live and deadlines were localised by the script.
    wait_live(page)
    page.wait_for_function("document.querySelector('[data-countdown]')?.textContent.includes('left')")
    page.keyboard.press("?")  # the shortcuts dialog is app.js's
    page.wait_for_selector("#shortcuts-help[open]")
    page.keyboard.press("Escape")
    assert violations(page, console) == []

    # The request page: htmx's presence beat (a POST on load) and the form, under the same policy.
    with page.expect_response(lambda r: r.url.endswith(f"/requests/{ir.pk}/presence/")) as beat:
        page.goto(f"/requests/{ir.pk}/")
    assert beat.value.status == 200
    wait_live(page)
    page.wait_for_selector("#answer-form")
    assert violations(page, console) == []

    page.goto("/admin/")
    page.wait_for_selector("#site-name")
    assert violations(page, console) == []

    page.goto("/api/v1/docs")
    page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)  # Swagger UI rendered the operations
    assert violations(page, console) == []
