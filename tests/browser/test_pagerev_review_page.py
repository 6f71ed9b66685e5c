"""The request page in a real browser, as a reviewer walks it: a server's very long text, the keyboard through
a long form, a request answered elsewhere while the reviewer was typing, and the Back button after answering
or after a refused answer."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import InputRequest, Membership, Team
from approvals.services import answers
from tests import factories
from tests.browser.conftest import wait_live
from tests.hub import Hub
from tests.live import wait_until

pytestmark = pytest.mark.timeout(120)

QUEUE_URL = re.compile(r"^http://127\.0\.0\.1:\d+/$")
APPROVE = re.compile("Approve and send")


def relay(
    hub: Hub, schema: dict[str, Any], *, message: str = "Fill this in", tool: str = "deploy"
) -> InputRequest:
    """A form request with the schema given, pending for team "release" (a relay carries any schema)."""
    response = hub.agent.post(
        "/relays",
        {
            "server": "demo",
            "tool": tool,
            "arguments": {"branch": "main"},
            "input_requests": {
                "q": {
                    "method": "elicitation/create",
                    "params": {"message": message, "requestedSchema": schema},
                }
            },
        },
    )
    assert response.status_code == 201, response.content
    call_id = response.json()["id"]
    return wait_until(  # type: ignore[return-value]
        lambda: InputRequest.objects.filter(round__call_id=call_id, status="pending").first(),
        30,
        what="the relayed request",
    )


def open_request(page: Any, ir: InputRequest) -> None:
    page.goto(f"/requests/{ir.pk}/")
    expect(page.get_by_role("button", name=APPROVE)).to_be_enabled()  # armed a second after it appears


def overflowing(page: Any) -> list[str]:
    """Elements reaching past the window's right edge (the page scrolls sideways)."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('body *'))
             .filter((e) => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
             .map((e) => e.tagName + (e.className ? '.' + e.className : ''))"""
    )


ENV = {"type": "string", "enum": ["staging", "production"]}
# How much of a field's text can be selected, to copy (a disabled field's text cannot be).
SELECTABLE = "e => { e.select(); return e.disabled ? 0 : e.selectionEnd - e.selectionStart; }"


def test_a_servers_very_long_words_wrap_instead_of_widening_the_page_and_the_queue(
    hub: Hub, new_page
) -> None:
    word = "W" * 600
    schema = {
        "type": "object",
        "properties": {
            "x" * 100: {"type": "string", "title": word, "description": word, "default": word},
            "pick": {"type": "string", "enum": [word, "b"], "enumNames": [word, "B"]},
            "many": {"type": "array", "items": {"type": "string", "anyOf": [{"const": "q", "title": word}]}},
        },
    }
    ir = relay(hub, schema, message=word, tool="T" * 190)
    page = new_page("alice", viewport={"width": 800, "height": 800})
    page.wait_for_selector(f"[data-request='{ir.pk}']")
    assert overflowing(page) == []
    open_request(page, ir)
    assert overflowing(page) == []
    assert page.locator("h1 .tool").inner_text() == "T" * 190  # wrapped, not cut short
    page.set_viewport_size({"width": 380, "height": 800})
    assert overflowing(page) == []


def test_a_field_reached_with_tab_is_never_hidden_under_the_decision_bar(hub: Hub, new_page) -> None:
    schema = {
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "title": f"Field {i}"} for i in range(12)},
    }
    ir = relay(hub, schema)
    page = new_page("alice", viewport={"width": 1000, "height": 600})
    open_request(page, ir)
    page.get_by_role("link", name="← Queue").focus()
    hidden = []
    for i in range(12):
        page.keyboard.press("Tab")
        box = page.evaluate(
            """() => { const field = document.activeElement.getBoundingClientRect();
                       const bar = document.querySelector('[data-decision]').getBoundingClientRect();
                       return {id: document.activeElement.id, bottom: field.bottom, bar: bar.top}; }"""
        )
        assert box["id"] == f"field-{i}"
        if box["bottom"] > box["bar"]:
            hidden.append(box)
    assert hidden == []


def test_a_request_answered_elsewhere_locks_the_page_keeping_what_was_typed_to_copy(
    hub: Hub, new_page
) -> None:
    schema = {"type": "object", "properties": {"env": ENV, "note": {"type": "string"}}, "required": ["env"]}
    ir = relay(hub, schema)
    bob = factories.user("bob")
    Membership.objects.create(team=Team.objects.get(slug="release"), user=bob, role="reviewer")
    page = new_page("alice")
    open_request(page, ir)
    wait_live(page)
    page.get_by_label("Note").fill("careful words about this release")
    page.locator("[data-decline-toggle]").click()
    page.get_by_label("Reason").fill("the branch is wrong")

    answers.input_respond(input_request_id=ir.pk, user=bob, action="accept", content={"env": "staging"})

    page.wait_for_selector("[data-decided-slot] .decided:has-text('Approved by bob')")
    expect(page.locator(".status-line")).to_be_hidden()  # no "Pending", no countdown beside "Approved"
    expect(page.get_by_role("button", name=APPROVE)).to_be_disabled()
    note, reason = page.get_by_label("Note"), page.get_by_label("Reason")
    for field, text in ((note, "careful words about this release"), (reason, "the branch is wrong")):
        expect(field).to_be_visible()
        expect(field).to_have_value(text)
        expect(field).not_to_be_editable()
        assert field.evaluate(SELECTABLE) == len(text)
    expect(page.get_by_label("staging")).to_be_disabled()
    expect(page.locator("[data-decision] button[type=submit]:enabled")).to_have_count(0)


def test_back_after_answering_shows_the_answer_not_the_open_form(hub: Hub, new_page) -> None:
    ir = relay(hub, {"type": "object", "properties": {"env": ENV}, "required": ["env"]})
    page = new_page("alice")
    open_request(page, ir)
    page.get_by_label("staging").check()
    page.get_by_role("button", name=APPROVE).click()
    page.wait_for_url(QUEUE_URL)
    assert page.locator("[data-follow-call]").get_attribute("href") == f"/calls/{ir.round.call_id}/"

    page.go_back()
    expect(page.locator("[data-decided-slot] .decided")).to_contain_text("Approved by alice")
    expect(page.locator(".badge-status-answered")).to_be_visible()  # drawn afresh, not the kept copy
    assert page.locator("[data-open-request]").count() == 0
    assert page.locator("form[data-answer-form]").count() == 0


def test_a_refused_answer_reloads_and_comes_back_as_the_request_not_a_form_to_send_again(
    hub: Hub, new_page
) -> None:
    ir = relay(
        hub, {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}, "required": ["n"]}
    )
    page = new_page("alice")
    open_request(page, ir)
    page.locator("form[data-answer-form]").evaluate("f => { f.dataset.clientChecks = 'off' }")
    page.get_by_label("N", exact=True).fill("9")
    with page.expect_response(lambda r: r.url.endswith("/respond/")) as refused:
        page.get_by_role("button", name=APPROVE).click()
    assert refused.value.status == 422
    expect(page.locator(".field-error")).to_have_text("Must be at most 3")
    # The page's script swaps the address once it runs (the error above is drawn by the server, before it).
    expect(page).to_have_url(re.compile(rf"/requests/{ir.pk}/$"))

    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" and "/respond/" in r.url else None)
    page.goto("/")
    page.go_back()
    expect(page.get_by_label("N", exact=True)).to_be_editable()
    page.reload()
    expect(page.get_by_label("N", exact=True)).to_be_editable()
    assert posts == []  # nothing was sent again
    ir.refresh_from_db()
    assert ir.status == "pending"


def test_the_browsers_own_checks_say_what_the_server_would_in_the_same_words(hub: Hub, new_page) -> None:
    """Singular where the limit is one, and the summary names each field as its label does, without
    "(optional)"."""
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 1},
            "one": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 1},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["tags"],
    }
    ir = relay(hub, schema)
    page = new_page("alice")
    open_request(page, ir)
    page.get_by_label("x", exact=True).check()
    page.get_by_label("y", exact=True).check()
    page.get_by_label("Email").fill("a@")
    page.get_by_role("button", name=APPROVE).click()
    summary = page.locator(".error-summary li")
    expect(summary).to_have_text(
        [
            "Tags: Choose at least 1 option",
            "One: Choose at most 1 option",
            "Email: Enter an email address like name@example.com",
        ]
    )
    assert "/requests/" in page.url  # nothing was sent

    # The server, asked directly, says the same beside each field.
    page.locator("form[data-answer-form]").evaluate("f => { f.dataset.clientChecks = 'off' }")
    page.get_by_role("button", name=APPROVE).click()
    error = "[data-field][data-name='f-{}'] .field-error"
    expect(page.locator(error.format("tags"))).to_have_text("Choose at least 1 option")
    expect(page.locator(error.format("one"))).to_have_text("Choose at most 1 option")
    expect(page.locator(".error-summary li")).to_have_text(
        [
            "Tags: Choose at least 1 option",
            "One: Choose at most 1 option",
            "Email: Enter an email address like name@example.com",
        ]
    )


def test_a_decline_sent_after_someone_else_answered_comes_back_locked_with_its_reason(
    hub: Hub, new_page
) -> None:
    ir = relay(hub, {"type": "object", "properties": {"env": ENV}})
    bob = factories.user("bob")
    Membership.objects.create(team=Team.objects.get(slug="release"), user=bob, role="reviewer")
    page = new_page("alice")
    page.route_web_socket(re.compile(r"/ws/"), lambda ws: ws.close())  # no live lock: the click goes out
    open_request(page, ir)
    page.locator("[data-decline-toggle]").click()
    page.get_by_label("Reason").fill("the branch is wrong")
    answers.input_respond(input_request_id=ir.pk, user=bob, action="cancel")

    with page.expect_response(lambda r: r.url.endswith("/respond/")) as refused:
        page.get_by_role("button", name="Decline the request").click()
    assert refused.value.status == 409
    expect(page.locator(".notice")).to_contain_text("already cancelled by bob")
    reason = page.get_by_label("Reason")
    expect(reason).to_be_visible()
    expect(reason).to_have_value("the branch is wrong")
    expect(reason).not_to_be_editable()
    assert reason.evaluate(SELECTABLE) == len("the branch is wrong")
    expect(page.locator("[data-decision] button:enabled")).to_have_count(0)
    # The refused page takes the request's own address once its script runs (the locked state above is
    # drawn by the server, so it can show first).
    expect(page).to_have_url(re.compile(rf"/requests/{ir.pk}/$"))


def test_escape_leaves_the_request_only_when_nothing_typed_would_be_lost(hub: Hub, new_page) -> None:
    ir = relay(hub, {"type": "object", "properties": {"note": {"type": "string"}, "env": ENV}})
    page = new_page("alice")
    open_request(page, ir)
    page.get_by_label("Note").fill("half an answer")
    page.keyboard.press("Escape")  # leaves the field
    page.keyboard.press("Escape")  # would leave the page
    expect(page.locator("[data-back]")).to_be_focused()
    assert page.evaluate("location.pathname") == f"/requests/{ir.pk}/"
    expect(page.get_by_label("Note")).to_have_value("half an answer")

    page.get_by_label("Note").fill("")
    page.get_by_label("staging").check()
    page.keyboard.press("Escape")
    page.keyboard.press("Escape")
    expect(page.locator("[data-back]")).to_be_focused()  # a choice counts too
    assert page.evaluate("location.pathname") == f"/requests/{ir.pk}/"

    page.reload()
    page.keyboard.press("Escape")  # nothing changed: Esc goes back to the queue
    page.wait_for_url(QUEUE_URL)
