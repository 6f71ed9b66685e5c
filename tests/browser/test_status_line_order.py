"""Two deadline extensions in quick succession each make an open request page read its status line again;
the two reads may come back in either order. The page keeps the line of the read it asked for last: the
first read's answer, arriving after the second's, showed the earlier deadline until the page was reloaded."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import InputRequest, Membership, Policy, Round, Team
from approvals.services import extensions
from tests import factories
from tests.browser.conftest import wait_live
from tests.browser.test_pagerev_review_page import ENV, open_request, relay
from tests.hub import Hub

pytestmark = pytest.mark.timeout(120)


def test_a_status_line_read_answered_late_does_not_bring_back_an_earlier_deadline(
    hub: Hub, new_page: Any
) -> None:
    bob = factories.user("bob")
    Membership.objects.create(team=Team.objects.get(slug="release"), user=bob, role="reviewer")
    policy = Policy.objects.create(name="twice", extend_by=1800, max_extensions=2)
    ir = relay(hub, {"type": "object", "properties": {"environment": ENV}})
    InputRequest.objects.filter(pk=ir.pk).update(policy=policy)
    page = new_page("alice")
    open_request(page, ir)
    wait_live(page)
    countdown = page.locator(".status-line [data-countdown]").first

    shown = countdown.get_attribute("data-countdown")
    held: list[Any] = []
    page.route(f"**/requests/{ir.pk}/", lambda route: held.append(route) if not held else route.continue_())

    extensions.round_extend(input_request_id=ir.pk, user=bob)
    # What the first read would have answered, had it come back at once: the page after one extension.
    stale = page.request.get(f"/requests/{ir.pk}/").text()
    for _ in range(200):  # the page heard of it and asked (route handlers run while Playwright waits)
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1
    extensions.round_extend(input_request_id=ir.pk, user=bob)

    # The second read went through and is drawn; then the first comes back, late, with the earlier deadline.
    expect(countdown).not_to_have_attribute("data-countdown", shown or "")
    latest = countdown.get_attribute("data-countdown")
    assert latest and latest not in stale  # the stale page shows the deadline after one extension
    held[0].fulfill(status=200, content_type="text/html; charset=utf-8", body=stale)
    page.wait_for_timeout(500)
    expect(countdown).to_have_attribute("data-countdown", latest)
    assert Round.objects.get(pk=ir.round_id).extensions == 2
