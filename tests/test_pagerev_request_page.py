"""The request page as a reviewer meets it after the moment has passed: a request past its deadline that beat
has not expired yet, the page the Back button shows after answering, and where the queue says to follow the
call the answer continued."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

from approvals.models import InputRequest, Membership, Round
from approvals.services.answers import input_respond
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy <b>bot</b>", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    return SimpleNamespace(alice=alice, release=release, deploy=deploy, agent=agent)


def ask(world: Any) -> InputRequest:
    rnd = factories.open_round(factories.call(world.deploy, world.agent), team_=world.release)
    return rnd.input_requests.get()


def overdue(ir: InputRequest) -> None:
    """The round's deadline passed a moment ago; beat (every 15 s) has not expired it yet."""
    Round.objects.filter(pk=ir.round_id).update(deadline=timezone.now() - timedelta(seconds=1))


def test_a_request_past_its_deadline_is_shown_expired_not_open_for_answers(client, world) -> None:
    ir = ask(world)
    overdue(ir)
    client.force_login(world.alice)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "data-overdue" in html and "can no longer be answered" in html
    assert ">Pending<" not in html
    assert "data-open-request" not in html  # no presence beat, no live lock to wait for
    assert 'id="answer-form"' not in html  # nothing to fill in
    assert "Approve and send</strong> sends" not in html


def test_an_invalid_answer_past_the_deadline_is_told_it_came_too_late_not_what_was_wrong(
    client, world
) -> None:
    ir = ask(world)
    overdue(ir)
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "nowhere"})
    assert response.status_code == 409
    html = response.content.decode()
    assert "This request expired at" in html
    assert "error-summary-title" not in html  # the field errors would send the reviewer fixing a dead form
    assert "Choose one of the options" not in html
    ir.refresh_from_db()
    assert ir.status == "pending" and ir.content is None


def test_the_request_page_and_its_refusals_are_never_kept_by_the_browser(client, world) -> None:
    """Back after answering reads the request again: a kept copy would say "Pending" with an open form."""
    ir = ask(world)
    client.force_login(world.alice)
    pages = {
        "page": client.get(f"/requests/{ir.pk}/"),
        "refused": client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "x"}),
        "queue": client.get("/"),
        "call": client.get(f"/calls/{ir.round.call_id}/"),
    }
    assert pages["refused"].status_code == 422
    for name, response in pages.items():
        assert "no-store" in response.get("Cache-Control", ""), name
    # The page drawn for the refused POST names the request's own address, for the script to take.
    assert f'data-page-url="/requests/{ir.pk}/"' in pages["refused"].content.decode()


def test_the_queue_says_where_to_follow_the_call_after_an_answer(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "staging"})
    assert response.status_code == 302
    [message] = [str(m) for m in get_messages(response.wsgi_request)]
    assert f'<a href="/calls/{ir.round.call_id}/" data-follow-call>Follow the call</a>' in message
    assert "Deploy &lt;b&gt;bot&lt;/b&gt;" in message  # the server's name stays text
    html = client.get("/").content.decode()
    assert f'href="/calls/{ir.round.call_id}/" data-follow-call' in html
    assert "<b>bot</b>" not in html


def test_a_confirmation_says_what_approving_sends_instead_of_zero_values(client, world) -> None:
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(requested_schema={"type": "object", "properties": {}})
    client.force_login(world.alice)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "sends 0 values" not in html
    assert "tells <bdi>Deploy &lt;b&gt;bot&lt;/b&gt;</bdi> yes, with no values" in html


def test_a_decline_answered_meanwhile_keeps_its_reason_in_view(client, world) -> None:
    ir = ask(world)
    bob = factories.user("bob")
    Membership.objects.create(team=world.release, user=bob, role=Membership.Role.REVIEWER)
    input_respond(input_request_id=ir.pk, user=bob, action="cancel")
    client.force_login(world.alice)
    reason = "Not on a Friday <evening>"
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "decline", "reason": reason})
    assert response.status_code == 409
    html = response.content.decode()
    assert "already cancelled by bob" in html
    assert '<details class="decline" data-decline open>' in html
    assert ">Not on a Friday &lt;evening&gt;</textarea>" in html


def test_a_refused_decline_reason_comes_back_to_be_corrected(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "decline", "reason": "wrong\x00branch"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "The reason holds" in html
    assert "data-decline open" in html
    assert ">wrong\u27e8U+0000\u27e9branch</textarea>" in html  # the NUL shown where it is, not sent back
    ir.refresh_from_db()
    assert ir.status == "pending"
