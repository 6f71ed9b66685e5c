"""A number typed in another script's digits (Persian, Arabic-Indic) is a number to the hub's server-side
check; the page's own check must not refuse what the server would take."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser.test_pagerev_review_page import APPROVE, open_request, relay
from tests.hub import Hub
from tests.live import wait_until

QUEUE_URL = re.compile(r"^http://127\.0\.0\.1:\d+/$")


def test_a_number_in_persian_digits_is_sent_and_read_as_the_number(hub: Hub, new_page) -> None:
    schema = {
        "type": "object",
        "properties": {"replicas": {"type": "integer", "minimum": 1, "maximum": 20}},
        "required": ["replicas"],
    }
    ir = relay(hub, schema)
    page = new_page("alice")
    open_request(page, ir)
    page.get_by_label("Replicas").fill("\u06f1\u06f2")  # ۱۲
    page.get_by_role("button", name=APPROVE).click()
    expect(page).to_have_url(QUEUE_URL)
    answered = wait_until(lambda: ir.__class__.objects.get(pk=ir.pk).content, 10, what="the answer")
    assert answered == {"replicas": 12}
