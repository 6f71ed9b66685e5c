"""An open request's deadline is announced to a screen reader as it comes close (UX.md, "Deadlines:
announce at thresholds"): once at five minutes, once at one, once when it passes; never every second."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.models import InputRequest, Membership, Policy, Round, Team
from tests import factories
from tests.browser.conftest import wait_live
from tests.browser.test_pagerev_review_page import APPROVE, ENV, open_request, relay
from tests.hub import Hub

pytestmark = pytest.mark.timeout(120)


def test_the_deadline_is_announced_at_thresholds_not_every_second(hub: Hub, new_page: Any) -> None:
    ir = relay(hub, {"type": "object", "properties": {"environment": ENV}})
    page = new_page("alice")
    # The page's clock stands still from 65 seconds before the deadline, and moves only when told: how long
    # signing in and opening the page take does not decide which thresholds it finds already behind.
    opened = timezone.now()
    Round.objects.filter(pk=ir.round_id).update(deadline=opened + timedelta(seconds=65))
    page.clock.install(time=opened - timedelta(seconds=1))
    page.clock.pause_at(opened)
    page.goto(f"/requests/{ir.pk}/")
    page.clock.run_for(1_000)  # the approve button is armed a second after the page appears
    expect(page.get_by_role("button", name=APPROVE)).to_be_enabled()
    page.evaluate(
        """() => {
            window.heard = [];
            const region = document.getElementById('announcer');
            new MutationObserver(() => { if (region.textContent) window.heard.push(region.textContent); })
              .observe(region, { childList: true, characterData: true, subtree: true });
        }"""
    )
    announcer = page.locator("#announcer")
    # Opened inside five minutes: said once, as it stands.
    expect(announcer).to_have_text(re.compile(r"^1:0\d left to answer this request$"))
    # Crossing the last minute: said once more; then nothing for a few seconds.
    page.clock.run_for(6_000)
    page.wait_for_function("() => window.heard.some((t) => t.includes('left to answer'))")
    page.clock.run_for(3_000)
    heard = [text for text in page.evaluate("() => window.heard") if "left to answer" in text]
    assert len(heard) == 1, heard  # once per threshold, not every second
    assert re.fullmatch(r"(1:00|0:5\d) left to answer this request", heard[0]), heard


def test_a_deadline_extended_by_one_reviewer_moves_on_the_others_open_page(hub: Hub, new_page: Any) -> None:
    bob = factories.user("bob")
    Membership.objects.create(team=Team.objects.get(slug="release"), user=bob, role="reviewer")
    policy = Policy.objects.create(name="extendable", extend_by=1800, max_extensions=1)
    ir = relay(hub, {"type": "object", "properties": {"environment": ENV}})
    InputRequest.objects.filter(pk=ir.pk).update(policy=policy)
    before = Round.objects.get(pk=ir.round_id).deadline
    alice, bobs = new_page("alice"), new_page("bob")
    open_request(alice, ir)
    wait_live(alice)
    open_request(bobs, ir)
    countdown = alice.locator(".status-line [data-countdown]").first
    shown_before = countdown.get_attribute("data-countdown")
    alice.evaluate("() => { window.sameDocument = true; }")

    bobs.get_by_role("button", name="Add 30 minutes").click()
    bobs.locator(".messages").wait_for()
    assert "Deadline extended" in bobs.locator(".messages").inner_text()

    after = Round.objects.get(pk=ir.round_id).deadline
    assert after - before == timedelta(minutes=30)
    # Alice's page, never reloaded, shows the new deadline; her form is still hers to send.
    expect(countdown).not_to_have_attribute("data-countdown", shown_before or "")
    assert alice.locator("[data-answer-form]").count() == 1
    assert alice.evaluate("() => window.sameDocument === true")  # not reloaded
