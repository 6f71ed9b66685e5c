"""An open request's deadline is announced to a screen reader as it comes close (UX.md, "Deadlines:
announce at thresholds"): once at five minutes, once at one, once when it passes; never every second."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from approvals.models import Round
from tests.browser.test_pagerev_review_page import ENV, open_request, relay
from tests.hub import Hub

pytestmark = pytest.mark.timeout(120)


def test_the_deadline_is_announced_at_thresholds_not_every_second(hub: Hub, new_page: Any) -> None:
    ir = relay(hub, {"type": "object", "properties": {"environment": ENV}})
    Round.objects.filter(pk=ir.round_id).update(deadline=timezone.now() + timedelta(seconds=70))
    page = new_page("alice")
    open_request(page, ir)
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
    # Crossing the last minute: said once more (within about ten seconds of opening).
    page.wait_for_function("() => window.heard.some((t) => t.includes('left to answer'))", timeout=20_000)
    page.wait_for_timeout(2_500)
    heard = [text for text in page.evaluate("() => window.heard") if "left to answer" in text]
    assert len(heard) == 1, heard  # once per threshold, not every second
    assert re.fullmatch(r"(1:00|0:5\d) left to answer this request", heard[0]), heard
