"""The reviewer's pages with the data a hub really meets: a relay's answers, a reviewer since deleted."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import InputRequest, Membership, ToolCall
from approvals.services.answers import input_respond
from tests import factories

pytestmark = pytest.mark.django_db

PASSWORD_SCHEMA = {
    "type": "object",
    "properties": {"user": {"type": "string"}, "password": {"type": "string", "title": "Password"}},
    "required": ["user", "password"],
}


@pytest.fixture
def world() -> Any:
    alice, bob, vera = (factories.user(name) for name in ("alice", "bob", "vera"))
    release = factories.team(
        "release",
        (alice, Membership.Role.REVIEWER),
        (bob, Membership.Role.REVIEWER),
        (vera, Membership.Role.VIEWER),
    )
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    return SimpleNamespace(alice=alice, bob=bob, vera=vera, release=release, deploy=deploy, agent=agent)


def ask(world: Any, **call_args: Any) -> InputRequest:
    rnd = factories.open_round(factories.call(world.deploy, world.agent, **call_args), team_=world.release)
    return rnd.input_requests.get()


def test_a_relays_answers_show_a_typed_password_hidden_on_the_call_page(client, world) -> None:
    """The agent gets the password; the call's page, which every member of the team reads, does not."""
    ir = ask(world, kind=ToolCall.Kind.RELAY)
    InputRequest.objects.filter(pk=ir.pk).update(key="login", requested_schema=PASSWORD_SCHEMA)
    content = {"user": "deployer", "password": "hunter2-S3CRET"}
    input_respond(input_request_id=ir.pk, user=world.alice, action="accept", content=content)
    call = ToolCall.objects.get(pk=ir.round.call_id)
    assert call.status == ToolCall.Status.ANSWERED and call.input_responses
    assert call.input_responses["login"]["content"]["password"] == "hunter2-S3CRET"
    client.force_login(world.vera)
    for page in (f"/calls/{call.pk}/", f"/calls/{call.pk}/body/"):
        html = client.get(page).content.decode()
        assert "hunter2-S3CRET" not in html, page
        assert "deployer" in html, page  # the answer itself is shown, its password hidden
        assert "(hidden)" in html, page


def test_an_answer_by_a_reviewer_since_deleted_is_not_shown_as_the_agents_cancel(client, world) -> None:
    ir = ask(world)
    input_respond(input_request_id=ir.pk, user=world.bob, action="decline", reason="wrong branch")
    world.bob.delete()
    client.force_login(world.alice)
    for page in (f"/requests/{ir.pk}/", f"/requests/{ir.pk}/state/", f"/calls/{ir.round.call_id}/"):
        html = client.get(page).content.decode()
        assert "Cancelled by the agent" not in html, page
        assert "Declined by a user since deleted" in html, page
        assert "wrong branch" in html, page


def test_a_call_the_agent_withdrew_says_so(client, world) -> None:
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(
        status=InputRequest.Status.CANCELLED, action=InputRequest.Action.CANCEL, answered_at=timezone.now()
    )
    client.force_login(world.alice)
    assert "Cancelled by the agent" in client.get(f"/requests/{ir.pk}/").content.decode()


def test_the_first_of_two_approvals_is_not_reported_as_a_dismissal(client, world) -> None:
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(approvals_required=2)
    client.force_login(world.alice)
    response = client.post(
        f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "production"}, follow=True
    )
    html = response.content.decode()
    assert "without deciding" not in html
    assert "Your approval of “environment” is recorded; another reviewer must confirm it." in html
    ir.refresh_from_db()
    assert ir.status == "pending"


def test_the_request_page_says_how_many_approvals_it_needs_and_who_gave_them(client, world) -> None:
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(approvals_required=2)
    input_respond(
        input_request_id=ir.pk, user=world.alice, action="accept", content={"environment": "staging"}
    )
    client.force_login(world.bob)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "data-approvals" in html
    assert "2 distinct approvals of the same values needed" in html
    assert "So far: <bdi>alice</bdi>" in html


def test_the_queues_confirmation_shows_a_keys_direction_controls_as_codes(client, world) -> None:
    """The key is the server's: a right-to-left override in it would reverse the confirmation's words."""
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(key="env\u202eelbats")
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "decline", "reason": "no"}, follow=True)
    html = response.content.decode()
    assert "\u202e" not in html
    assert 'Declined “env<span class="ctl" title="U+202E">U+202E</span>elbats”' in html


def test_a_request_the_hub_declined_itself_says_why_on_its_page(client, world) -> None:
    ir = ask(world)
    problem = "Not shown to reviewers: the form uses “oneOf”. The hub answered decline."
    InputRequest.objects.filter(pk=ir.pk).update(
        status=InputRequest.Status.UNSUPPORTED,
        action=InputRequest.Action.DECLINE,
        answered_at=timezone.now(),
        problem=problem,
    )
    client.force_login(world.alice)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "Not shown: the hub answered decline" in html
    assert "the form uses “oneOf”" in html


def url_request(world: Any, url: str) -> InputRequest:
    """A url-mode request made for alice, opened the way a worker opens it."""
    from django.db import transaction

    from approvals.services import rounds

    call = factories.call(world.deploy, world.agent, on_behalf_of=world.alice)
    asked = {
        "signin": {
            "method": "elicitation/create",
            "params": {"mode": "url", "message": "Sign in", "url": url},
        }
    }
    raw = {"resultType": "input_required", "inputRequests": asked, "requestState": "opaque"}
    with transaction.atomic():
        rounds.round_open(
            call=call, input_requests=asked, raw=raw, request_state="opaque", received_at=timezone.now()
        )
    return InputRequest.objects.get(round__call=call)


@pytest.mark.parametrize(
    "sent",
    [
        " https://accounts.example.com/start?token=abc123",  # a space first: a path on the hub, as Location
        "https://accounts.example.com/start?token=abc123\n",  # a line break after: %0A in the token
        "https://accounts.example.com/start?to\tken=abc\n123",
    ],
)
def test_a_sign_in_link_opens_where_the_browser_would_go_and_as_shown(client, world, sent: str) -> None:
    """The hub judged and shows the address as a browser reads it (spaces around it, tabs and line breaks in
    it dropped): its redirect goes there too, not to a mangled copy."""
    ir = url_request(world, sent)
    client.force_login(world.alice)
    page = client.get(f"/requests/{ir.pk}/").content.decode()
    assert '<bdi dir="ltr">https://accounts.example.com/start?token=abc123</bdi>' in page
    response = client.post(f"/requests/{ir.pk}/open/")
    assert response.status_code == 303
    assert response["Location"] == "https://accounts.example.com/start?token=abc123"


def test_the_routing_page_shows_the_escalation_time_on_the_readers_clock(client, world) -> None:
    """Every other time on the pages is shown on the reader's clock (the page's script): this one too."""
    ops = factories.team("ops")
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(escalated_at=timezone.now(), escalation_team=ops)
    client.force_login(world.alice)
    html = client.get(f"/calls/{ir.round.call_id}/routing/").content.decode()
    escalated = html[html.index("Escalated to") :]
    assert "<time datetime=" in escalated
    assert "data-local-time" in escalated[: escalated.index("</time>")]


def test_the_approve_buttons_tell_a_screen_reader_their_shortcut(client, world) -> None:
    """The visible "Ctrl+Enter" beside the button is hidden from screen readers: the button names it."""
    client.force_login(world.alice)
    form_page = client.get(f"/requests/{ask(world).pk}/").content.decode()
    link_page = client.get(
        f"/requests/{url_request(world, 'https://accounts.example.com/go').pk}/"
    ).content.decode()
    for page in (form_page, link_page):
        button = page[page.index("data-approve") :]
        assert 'aria-keyshortcuts="Control+Enter Meta+Enter"' in button[: button.index(">")]
