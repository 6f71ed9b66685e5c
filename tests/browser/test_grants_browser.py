"""Grants in the browser: a reviewer approves a gate with "also allow the same again", the agent's identical
call then goes through without anyone, and revoking it on the grants page (after the confirmation) makes the
next one stop at a gate again.

Real parts throughout: Chromium (Playwright), Daphne, a Celery worker, the demo MCP server, PostgreSQL and
Redis; the agent is a REST client over real HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import AuditEvent, Grant
from tests.browser.conftest import confirm_second_look
from tests.browser.test_gates_browser import (
    ASKED,
    EDITED,
    TOOL,
    call_at_its_gate,
    edit_to_staging,
    gated_hub,
    sent,
)
from tests.hub import Hub

__all__ = ["gated_hub"]  # a fixture, used by name

STAGING = EDITED  # the demo server deploys to staging without asking anything more

pytestmark = [pytest.mark.timeout(240), pytest.mark.django_db(transaction=True)]


def test_a_grant_made_in_the_browser_lets_the_same_call_through_until_it_is_revoked(
    gated_hub: Hub, demo_server: Any, web: Any, new_page: Any
) -> None:
    agent, first, page = call_at_its_gate(gated_hub, web, new_page, STAGING)
    approve = page.locator("#gate-approve")
    approve.get_by_text("Also allow the same again…").click()
    approve.get_by_label("For 8 hours").check()
    assert approve.get_by_label("Exactly these arguments").is_checked()
    approve.get_by_role("button", name="Approve and send as asked").click()
    assert confirm_second_look(page)  # a destructive tool: the approval is shown once more
    page.locator(".messages").wait_for()  # the queue, with its confirmation
    assert agent.wait(first)["status"] == "completed"
    grant = Grant.objects.get()
    assert grant.granted_by.get_username() == "alice" and grant.arguments == STAGING

    again = agent.call(TOOL, STAGING)
    done = agent.wait(again)
    assert done["status"] == "completed" and done["gate"] is None
    assert AuditEvent.objects.filter(call_id=again, verb="gate.granted").count() == 1
    assert sent(demo_server.url) == [STAGING, STAGING]

    page.goto("/grants/")
    row = page.locator(f'[data-grant="{grant.pk}"]')
    assert "ci-agent" in row.inner_text() and "alice" in row.inner_text()
    row.get_by_role("link", name="Revoke…").click()
    assert Grant.objects.get().state() == "active"  # the confirmation page revokes nothing
    page.get_by_role("button", name="Revoke the grant for ci-agent").click()
    page.wait_for_url("**/grants/")
    assert "its next call stops for a person" in page.content()
    assert Grant.objects.get().state() == "revoked"

    after = agent.call(TOOL, STAGING)
    assert gated_hub.reviewer.wait_for_request(after, "gate")["gate"]["arguments"] == STAGING
    assert len(sent(demo_server.url)) == 2


def test_a_grant_made_with_an_edit_in_the_browser_covers_the_edited_arguments(
    gated_hub: Hub, demo_server: Any, web: Any, new_page: Any
) -> None:
    agent, first, page = call_at_its_gate(gated_hub, web, new_page, ASKED)
    page.get_by_text("Edit the arguments…").click()
    edit = page.locator("#gate-edit-form")
    edit_to_staging(edit)
    edit.get_by_text("Also allow the same again…").click()
    edit.get_by_label("For 1 hour").check()
    assert edit.get_by_label("Exactly these arguments").is_checked()
    edit.get_by_role("button", name="Approve and send these arguments").click()
    assert confirm_second_look(page)  # a destructive tool: the approval is shown once more
    page.locator(".messages").wait_for()  # the queue, with its confirmation
    assert agent.wait(first)["status"] == "completed"
    assert Grant.objects.get().arguments == EDITED

    again = agent.call(TOOL, EDITED)  # what was approved, as edited: through without anyone
    done = agent.wait(again)
    assert done["status"] == "completed" and done["gate"] is None
    assert sent(demo_server.url) == [EDITED, EDITED]
    asked = agent.call(TOOL, ASKED)  # what was asked and not approved: stops for a person
    assert gated_hub.reviewer.wait_for_request(asked, "gate")["gate"]["arguments"] == ASKED
