"""The dashboard's pages and actions through Django's test client: who sees what, and what each POST does."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Membership, Round, ToolCall
from approvals.services import presence
from approvals.services.answers import input_respond
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(client) -> Any:
    alice, bob, vera, olga = (factories.user(name) for name in ("alice", "bob", "vera", "olga"))
    release = factories.team(
        "release",
        (alice, Membership.Role.REVIEWER),
        (bob, Membership.Role.REVIEWER),
        (vera, Membership.Role.VIEWER),
    )
    ops = factories.team("ops", (olga, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    pager = factories.server("pager", name="Pager", default_team=ops)
    agent, _ = factories.agent("ci-bot", servers=[deploy, pager])
    return SimpleNamespace(**locals())


def ask(world: Any, server: Any = None, tool: str = "create_deployment", **round_args: Any) -> InputRequest:
    server = server or world.deploy
    team = server.default_team
    rnd = factories.open_round(factories.call(server, world.agent, tool=tool), team_=team, **round_args)
    return rnd.input_requests.order_by("key").first()


def test_pages_need_a_signed_in_user(client, world) -> None:
    ir = ask(world)
    for url in ("/", "/recent/", f"/requests/{ir.pk}/", f"/calls/{ir.round.call_id}/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_queue_shows_one_card_per_round_of_the_users_teams(client, world) -> None:
    mine = ask(world, keys=("environment", "confirm"))
    ask(world, server=world.pager, tool="page_oncall")
    client.force_login(world.alice)
    html = client.get("/").content.decode()
    assert "<title>(2) Queue · Elicit Hub</title>" in html
    assert html.count('<article class="card') == 1
    assert f'data-call="{mine.round.call_id}"' in html
    assert "Deploy bot" in html and "page_oncall" not in html
    assert html.count("data-pending-request") == 2
    assert "opaque-state" not in html  # requestState never reaches a page


def test_the_queue_filters_by_server_tool_and_mode(client, world) -> None:
    world.alice.is_superuser = True
    world.alice.save()
    ask(world, tool="create_deployment")
    ask(world, server=world.pager, tool="page_oncall")
    client.force_login(world.alice)
    assert client.get("/?server=pager").content.decode().count('<article class="card') == 1
    assert "page_oncall" in client.get("/?tool=page_oncall").content.decode()
    assert 'data-tool="create_deployment"' not in client.get("/?tool=page_oncall").content.decode()
    assert client.get("/?mode=url").content.decode().count('<article class="card') == 0
    fragment = client.get("/queue/list/?server=deploy").content.decode()
    assert fragment.startswith('<div class="queue-list"') and fragment.count('<article class="card') == 1


def test_a_backlog_shows_the_rounds_that_waited_longest_and_counts_them_all(client, world, settings) -> None:
    """Past ELICIT_QUEUE_MAX rounds the page shows the oldest (a backlog of hundreds was a page of hundreds of
    cards: 2.1 s and 2.4 MB at 1,500), counts every pending request, and says that newer ones wait."""
    settings.ELICIT_QUEUE_MAX = 2
    asked = [ask(world, keys=("environment", "confirm")), ask(world), ask(world), ask(world)]
    ask(world, server=world.pager, tool="page_oncall")  # another team's: neither shown nor counted
    client.force_login(world.alice)
    html = client.get("/").content.decode()
    assert "<title>(5) Queue · Elicit Hub</title>" in html
    assert '<span class="count" data-pending-count>5</span>' in html
    assert html.count('<article class="card') == 2
    assert [f'data-call="{ir.round.call_id}"' in html for ir in asked] == [True, True, False, False]
    assert 'data-pending-total="5" data-capped="2"' in html
    assert "Rounds with later deadlines wait behind the 2 shown here" in html
    # What the page asks as rounds come and go behind it: the count alone, with its filters.
    assert client.get("/queue/count/").json() == {"pending": 5}
    assert client.get("/queue/count/?tool=page_oncall").json() == {"pending": 0}
    # Answered, the oldest makes room for the next; the filters reach the others at once.
    for ir in asked[0].round.input_requests.all():
        input_respond(input_request_id=ir.pk, user=world.bob, action="cancel")
    assert client.get("/queue/count/").json() == {"pending": 3}
    fragment = client.get("/queue/list/").content.decode()
    assert [f'data-call="{ir.round.call_id}"' in fragment for ir in asked] == [False, True, True, False]
    settings.ELICIT_QUEUE_MAX = 3
    fragment = client.get("/queue/list/").content.decode()
    assert fragment.count('<article class="card') == 3
    assert "data-capped" not in fragment and "later deadlines" not in fragment


def test_the_queue_count_needs_a_signed_in_user(client, world) -> None:
    response = client.get("/queue/count/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_server_text_is_escaped_direction_neutral_and_never_linked(client, world) -> None:
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(
        message="سلام <b>bold</b> https://evil.example/x \u202ereversed"
    )
    client.force_login(world.alice)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert '<blockquote dir="auto" data-server-message>سلام &lt;b&gt;bold&lt;/b&gt;' in html
    assert 'href="https://evil.example' not in html
    assert '<span class="ctl" title="U+202E">U+202E</span>reversed' in html


def test_someone_outside_the_team_learns_nothing(client, world) -> None:
    ir = ask(world)
    client.force_login(world.olga)
    assert client.get(f"/requests/{ir.pk}/").status_code == 404
    assert client.get(f"/calls/{ir.round.call_id}/").status_code == 404
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "decline"})
    assert response.status_code == 404
    assert "Not found" in response.content.decode()
    ir.refresh_from_db()
    assert ir.status == "pending"


def test_a_team_viewer_sees_the_request_but_cannot_answer(client, world) -> None:
    ir = ask(world)
    client.force_login(world.vera)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "You can see this request but not answer it." in html
    assert "data-approve" not in html and "data-decision" not in html
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "cancel"})
    assert response.status_code == 403
    assert (
        '<div class="error-box" role="alert"' in response.content.decode()
    )  # the service's reason, readable


def test_accepting_sends_the_cleaned_values_and_returns_to_the_queue(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "staging"})
    assert response.status_code == 302 and response["Location"] == "/"
    ir.refresh_from_db()
    assert (ir.status, ir.action, ir.content, ir.answered_by) == (
        "answered",
        "accept",
        {"environment": "staging"},
        world.alice,
    )
    assert AuditEvent.objects.filter(input_request_id=ir.pk, verb="input.answered").count() == 1
    assert "Approved “environment”: sent to Deploy bot" in client.get("/").content.decode()


def test_declining_carries_the_reason(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    client.post(f"/requests/{ir.pk}/respond/", {"action": "decline", "reason": "I did not start this"})
    ir.refresh_from_db()
    assert (ir.action, ir.reason, ir.content) == ("decline", "I did not start this", None)


def test_cancel_is_dismiss_without_deciding(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    assert client.post(f"/requests/{ir.pk}/respond/", {"action": "cancel"}).status_code == 302
    ir.refresh_from_db()
    assert ir.action == "cancel"


def test_the_second_reviewer_is_told_who_answered_and_keeps_what_they_typed(client, world) -> None:
    ir = ask(world)
    input_respond(
        input_request_id=ir.pk, user=world.alice, action="accept", content={"environment": "staging"}
    )
    client.force_login(world.bob)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "production"})
    assert response.status_code == 409
    html = response.content.decode()
    assert "This request was already accepted by alice at" in html
    assert "Approved by <bdi>alice</bdi>" in html
    assert 'value="production" checked' in html  # bob's choice, shown locked
    assert '<fieldset class="form-body" data-form-body disabled>' in html
    ir.refresh_from_db()
    assert ir.content == {"environment": "staging"}


def test_a_reviewer_who_answered_in_another_tab_is_told_they_did(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    assert client.post(f"/requests/{ir.pk}/respond/", {"action": "decline"}).status_code == 302

    again = client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "staging"})

    assert again.status_code == 409
    assert "You already declined this request at" in again.text
    assert "by alice" not in again.text.split("You already", 1)[1].split("</div>", 1)[0]
    ir.refresh_from_db()
    assert ir.action == "decline"


def test_an_unknown_action_is_a_readable_message(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "approve-everything"})
    assert response.status_code == 400
    assert "action must be accept, decline or cancel." in response.content.decode()
    assert response["Content-Type"].startswith("text/html")


def url_request(world: Any, url: str) -> InputRequest:
    ir = ask(world)
    InputRequest.objects.filter(pk=ir.pk).update(
        mode="url", url=url, requested_schema=None, message="Sign in"
    )
    ir.refresh_from_db()
    return ir


def test_url_mode_records_consent_then_redirects_without_a_referrer(client, world) -> None:
    ir = url_request(world, "https://accounts.example.com/connect?attempt=1")
    client.force_login(world.alice)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "Deploy bot</bdi> wants you to open an external page" in html
    assert '<span class="domain-name">example.com</span>' in html
    assert 'href="https://accounts.example.com' not in html  # consent is a POST, never a link
    assert 'target="_blank" rel="noopener"' in html
    response = client.post(f"/requests/{ir.pk}/open/")
    assert response.status_code == 303
    assert response["Location"] == "https://accounts.example.com/connect?attempt=1"
    assert response["Referrer-Policy"] == "no-referrer"
    ir.refresh_from_db()
    assert (ir.action, ir.content) == ("accept", None)
    # A second click opens nothing: it tells the reviewer they answered already.
    again = client.post(f"/requests/{ir.pk}/open/")
    assert again.status_code == 409 and "You already accepted this request" in again.content.decode()


def test_url_mode_refuses_addresses_it_must_not_open(client, world) -> None:
    ir = url_request(world, "javascript:alert(1)")
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/open/")
    assert response.status_code == 400
    assert "The hub will not open this address" in response.content.decode()
    ir.refresh_from_db()
    assert ir.status == "pending"


def test_presence_shows_who_else_is_looking(client, world) -> None:
    ir = ask(world)
    client.force_login(world.bob)
    assert client.post(f"/requests/{ir.pk}/presence/").status_code == 200
    client.force_login(world.alice)
    assert "Being looked at by <bdi>bob</bdi>" in client.get("/").content.decode()
    assert "Being looked at by <bdi>bob</bdi>" in client.get(f"/requests/{ir.pk}/").content.decode()
    client.force_login(world.bob)
    client.post(f"/requests/{ir.pk}/presence/", {"leave": "1"})
    assert presence.viewers([ir.pk]) == {}


def test_the_call_page_shows_rounds_answers_audit_and_result(client, world) -> None:
    ir = ask(world)
    input_respond(input_request_id=ir.pk, user=world.alice, action="decline", reason="not today")
    call = ToolCall.objects.get(pk=ir.round.call_id)
    ToolCall.objects.filter(pk=call.pk).update(
        status="completed",
        finished_at=timezone.now(),
        result={"content": [{"type": "text", "text": "Declined by the reviewer"}], "isError": True},
    )
    client.force_login(world.bob)
    html = client.get(f"/calls/{call.pk}/").content.decode()
    assert "Round 1" in html
    assert "Declined by <bdi>alice</bdi>" in html and "not today" in html
    assert "<code>input.answered</code>" in html
    assert "Declined by the reviewer" in html and "The server reported an error" in html
    assert "opaque-state" not in html
    assert client.get(f"/calls/{call.pk}/body/").content.decode().startswith('<header class="call-head">')


def test_recent_activity_lists_calls_finished_in_the_last_day(client, world) -> None:
    today = factories.call(world.deploy, world.agent, tool="fresh_tool")
    old = factories.call(world.deploy, world.agent, tool="old_tool")
    open_call = factories.call(world.deploy, world.agent, tool="open_tool")
    ToolCall.objects.filter(pk=today.pk).update(
        status="completed", result={"content": []}, finished_at=timezone.now()
    )
    ToolCall.objects.filter(pk=old.pk).update(
        status="completed", result={"content": []}, finished_at=timezone.now() - timedelta(days=2)
    )
    Round.objects.create(call=open_call, number=1, deadline=timezone.now())
    client.force_login(world.alice)
    html = client.get("/recent/").content.decode()
    assert "fresh_tool" in html and "old_tool" not in html and "open_tool" not in html


def test_the_layout_has_the_navigation_other_pages_build_on(client, world) -> None:
    client.force_login(world.alice)
    html = client.get("/").content.decode()
    assert 'href="/recent/"' in html and 'href="/audit/"' in html
    assert 'href="/admin/"' not in html  # staff only
    assert '<form method="post" action="/accounts/logout/">' in html
    assert 'href="/accounts/password_change/"' in html
    assert 'aria-live="polite"' in html and 'data-live-url="/ws/queue/"' in html
    world.alice.is_staff = True
    world.alice.save()
    assert 'href="/admin/"' in client.get("/").content.decode()


def test_login_page_and_failed_login(client, world) -> None:
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
    assert "The user name and password do not match" in response.content.decode()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == "/"


# --- a url-mode link is shown to whoever may open it, and to nobody else ---------------------------------


def test_a_sign_in_link_made_for_one_reviewer_is_shown_to_them_alone(client, world) -> None:
    ir = url_request(world, "https://accounts.example.com/connect?token=s3cret-for-bob")
    InputRequest.objects.filter(pk=ir.pk).update(assignee=world.bob)
    for someone_else in (world.alice, world.vera):  # a reviewer of the team, a viewer
        client.force_login(someone_else)
        html = client.get(f"/requests/{ir.pk}/").content.decode()
        assert "s3cret-for-bob" not in html and "data-full-url" not in html
        assert "made for <bdi>bob</bdi> and is shown only to them" in html
        assert '<span class="domain-name">example.com</span>' in html  # where it goes, all the same
    client.force_login(world.bob)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "connect?token=s3cret-for-bob" in html and "data-url-withheld" not in html


def test_a_viewer_sees_where_a_link_goes_not_the_link(client, world) -> None:
    ir = url_request(world, "https://accounts.example.com/connect?token=team-secret")
    client.force_login(world.vera)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "team-secret" not in html and "shown only to those who may answer" in html
    client.force_login(world.alice)
    assert "team-secret" in client.get(f"/requests/{ir.pk}/").content.decode()


def test_a_refused_link_shows_where_it_goes_not_what_it_carries(client, world) -> None:
    ir = url_request(world, "https://deploy:hunter2@example.com/connect?token=abc123")
    client.force_login(world.alice)
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert "The hub will not open this address" in html and "https://example.com" in html
    assert "hunter2" not in html and "abc123" not in html


def test_the_audit_trail_shows_where_a_link_went_not_its_token(client, world) -> None:
    from approvals.audit import core as audit

    ir = url_request(world, "https://accounts.example.com:8443/connect?token=s3cret")
    audit.record(
        actor=audit.Actor.system(),
        verb="input.requested",
        call=ir.round.call,
        input_request=ir,
        data={"message": "Sign in", "mode": "url"},
    )
    world.alice.is_superuser = True
    world.alice.save()
    client.force_login(world.alice)
    html = client.get(f"/audit/calls/{ir.round.call_id}/").content.decode()
    assert "https://accounts.example.com:8443" in html
    assert "s3cret" not in html and "/connect" not in html


# --- a decision's address, visited ---------------------------------------------------------------------


def test_a_decision_address_visited_after_signing_in_again_leads_to_the_request(client, world) -> None:
    ir = ask(world)
    for action in ("respond", "decide", "open"):
        # The session ran out: the POST goes to the sign-in page, which sends the browser back with a GET.
        response = client.post(f"/requests/{ir.pk}/{action}/", {"action": "accept"})
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")
        client.force_login(world.alice)
        back = client.get(f"/requests/{ir.pk}/{action}/")
        assert back.status_code == 302 and back["Location"] == f"/requests/{ir.pk}/"
        client.logout()
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING  # a visit never decides


def test_a_method_a_page_does_not_take_gets_a_readable_page(client, world) -> None:
    ir = ask(world)
    client.force_login(world.alice)
    response = client.get(f"/requests/{ir.pk}/presence/")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response["Content-Type"].startswith("text/html")
    assert "Not available this way" in response.content.decode()
    refused = client.delete(f"/requests/{ir.pk}/respond/")
    assert refused.status_code == 405 and "Not available this way" in refused.content.decode()


# --- an answer that came too late -----------------------------------------------------------------------


def test_a_late_answer_is_told_it_came_too_late_even_when_it_is_also_invalid(client, world) -> None:
    ir = ask(world)
    input_respond(input_request_id=ir.pk, user=world.bob, action="accept", content={"environment": "staging"})
    client.force_login(world.alice)
    response = client.post(
        f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "not-a-choice"}
    )
    assert response.status_code == 409
    html = response.content.decode()
    assert "already accepted by bob at" in html
    assert ".." not in html.split("already accepted by bob at", 1)[1].split("</", 1)[0]


def test_a_sign_in_links_token_reaches_no_page_of_a_viewer_nor_the_audit_trail(client, world) -> None:
    """Opened the way a worker opens it (the server's raw answer stored with the round)."""
    from django.db import transaction

    from approvals.services import rounds

    call = factories.call(world.deploy, world.agent)
    url = "https://accounts.example.com/connect?token=S3CRET-LINK"
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
    ir = InputRequest.objects.get(round__call=call)
    client.force_login(world.vera)  # a viewer of the team
    for page in (f"/requests/{ir.pk}/", f"/calls/{call.pk}/", f"/audit/calls/{call.pk}/"):
        html = client.get(page).content.decode()
        assert "S3CRET-LINK" not in html, page
    assert "https://accounts.example.com" in client.get(f"/audit/calls/{call.pk}/").content.decode()


def test_accepting_a_request_whose_schema_makes_no_form_is_a_readable_refusal(client, world) -> None:
    """A request stored before a stricter schema check (titled choices under draft 4, which has no const)
    draws no form; an accept posted anyway (a stale or forged page) is refused on the page, not a 500."""
    ir = ask(world)
    choices = [{"const": "keep", "title": "Keep"}, {"const": "drop", "title": "Drop"}]
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"c": {"type": "string", "oneOf": choices}},
    }
    InputRequest.objects.filter(pk=ir.pk).update(requested_schema=schema)
    client.force_login(world.alice)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-c": "anything"})
    assert response.status_code == 422
    assert "titled choices need JSON Schema draft 6 or later" in response.content.decode()
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING
