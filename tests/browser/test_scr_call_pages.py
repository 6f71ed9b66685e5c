"""The call's pages in a real browser with the text servers and agents really send: one very long word in an
answer's key and value, in an error, in a routing rule's reason; none of it widens the page."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from approvals.models import InputRequest, Membership, ToolCall
from approvals.services.answers import input_respond
from tests import factories

pytestmark = pytest.mark.timeout(120)

WORD = "W" * 600


def overflowing(page: Any) -> list[str]:
    """Elements reaching past the window's right edge (the page scrolls sideways)."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('body *'))
             .filter((e) => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
             .map((e) => e.tagName + (e.className ? '.' + e.className : ''))"""
    )


@pytest.fixture
def long_call(live_db: None) -> ToolCall:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server("deploy", name="D" * 120, default_team=release)
    agent, _ = factories.agent("A" * 80, servers=[server])
    call = factories.call(server, agent, tool="T" * 190, arguments={WORD: WORD})
    rnd = factories.open_round(call, team_=release)
    ir = rnd.input_requests.get()
    schema = {"type": "object", "properties": {"k" * 100: {"type": "string"}}}
    InputRequest.objects.filter(pk=ir.pk).update(
        key="K" * 400,
        message=WORD,
        requested_schema=schema,
        routing={"matched": WORD, "checked": [{"rule": WORD, "matched": False, "why": WORD}]},
    )
    input_respond(input_request_id=ir.pk, user=alice, action="accept", content={"k" * 100: WORD})
    ToolCall.objects.filter(pk=call.pk).update(
        status=ToolCall.Status.FAILED,
        finished_at=timezone.now(),
        error={"code": "C" * 300, "message": WORD},
    )
    return call


@pytest.mark.parametrize("width", [800, 380])
def test_a_calls_pages_wrap_very_long_words_instead_of_widening_the_page(
    web: Any, new_page: Any, long_call: ToolCall, width: int
) -> None:
    page = new_page("alice", viewport={"width": width, "height": 800})
    for address in (f"/calls/{long_call.pk}/", f"/calls/{long_call.pk}/routing/"):
        page.goto(address)
        assert overflowing(page) == [], (address, overflowing(page))
    page.goto("/recent/")
    # A table as wide as its columns' shortest words: on a phone it scrolls inside its own frame.
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    if width >= 800:
        assert overflowing(page) == []
