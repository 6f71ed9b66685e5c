"""Deadline extensions: a reviewer adds the policy's ``extend_by`` to a round's deadline, where it allows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals import broadcast
from approvals.models import (
    AuditEvent,
    InputRequest,
    McpServer,
    Membership,
    Policy,
    Round,
    RoutingRule,
    Team,
    ToolCall,
)
from approvals.services import answers, calls, escalation, extensions, tokens
from approvals.services.errors import Conflict, Forbidden
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> Any:
    return factories.user("alice")


@pytest.fixture
def release(alice: Any) -> Team:
    return factories.team("release", (alice, Membership.Role.REVIEWER))


def _request(
    team: Team,
    *,
    extend_by: int | None = 900,
    max_extensions: int = 1,
    ttl: int | None = 3600,
    left: timedelta = timedelta(hours=1),
    server_deadline: timedelta | None = None,
    **policy_fields: Any,
) -> InputRequest:
    policy = Policy.objects.create(
        name=f"policy {Policy.objects.count()}",
        ttl=ttl,
        extend_by=extend_by,
        max_extensions=max_extensions,
        **policy_fields,
    )
    call = factories.call(factories.server(f"srv{ToolCall.objects.count()}"))
    rnd = factories.open_round(call, team_=team)
    now = timezone.now()
    Round.objects.filter(pk=rnd.pk).update(
        deadline=now + left, server_deadline=now + server_deadline if server_deadline is not None else None
    )
    ir = rnd.input_requests.get()
    ir.policy = policy
    ir.save(update_fields=["policy"])
    return InputRequest.objects.select_related("round", "policy").get(pk=ir.pk)


def _deadline(ir: InputRequest) -> Any:
    return Round.objects.get(pk=ir.round_id).deadline


# --- the service ------------------------------------------------------------------------------------------


def test_an_extension_adds_the_policys_seconds_audits_and_redraws_the_cards(
    alice: Any, release: Team, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    ir = _request(release)
    before = _deadline(ir)
    notices: list[tuple[str, list[InputRequest]]] = []
    monkeypatch.setattr(
        broadcast, "queue_changed", lambda event, call_id, irs, card=None: notices.append((event, irs))
    )
    with django_capture_on_commit_callbacks(execute=True):
        rnd = extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert rnd.deadline == before + timedelta(seconds=900)
    stored = Round.objects.get(pk=ir.round_id)
    assert stored.deadline == before + timedelta(seconds=900) and stored.extensions == 1
    event = AuditEvent.objects.get(verb="round.extended")
    assert event.input_request_id == ir.pk and event.actor_label == "alice"
    assert event.data["old_deadline"] == before.isoformat()
    assert event.data["new_deadline"] == stored.deadline.isoformat()
    assert ir.policy is not None
    assert event.data["policy"] == ir.policy.name and event.data["seconds"] == 900
    # The round's cards are redrawn quietly (the queue pages show the new deadline).
    assert [(e, [x.pk for x in irs]) for e, irs in notices] == [("round.extended", [ir.pk])]


def test_a_policy_without_extend_by_allows_none(alice: Any, release: Team) -> None:
    ir = _request(release, extend_by=None)
    before = _deadline(ir)
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert refused.value.code == "extension_not_allowed"
    assert _deadline(ir) == before and not AuditEvent.objects.filter(verb="round.extended").exists()


def test_max_extensions_zero_allows_none(alice: Any, release: Team) -> None:
    ir = _request(release, max_extensions=0)
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert refused.value.code == "extension_not_allowed"
    assert extensions.offer(ir, alice) is None


def test_the_policy_admin_form_shows_the_new_fields(admin_client: Client) -> None:
    page = admin_client.get("/admin/approvals/policy/add/").content.decode()
    assert 'name="extend_by"' in page and 'name="max_extensions"' in page


def test_extensions_stop_at_max_extensions(alice: Any, release: Team) -> None:
    ir = _request(release, extend_by=60, max_extensions=2)
    first = _deadline(ir)
    extensions.round_extend(input_request_id=ir.pk, user=alice)
    extensions.round_extend(input_request_id=ir.pk, user=alice)
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert refused.value.code == "extensions_exhausted" and "2 times" in refused.value.message
    assert _deadline(ir) == first + timedelta(seconds=120)


@pytest.mark.parametrize("role", [Membership.Role.VIEWER, None])
def test_only_someone_who_may_answer_extends(release: Team, role: str | None) -> None:
    ir = _request(release)
    before = _deadline(ir)
    bob = factories.user("bob")
    if role:
        Membership.objects.create(team=release, user=bob, role=role)
    with pytest.raises(Forbidden) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=bob)
    assert refused.value.code == "not_a_reviewer"
    assert _deadline(ir) == before


def test_past_its_deadline_a_request_is_not_extended(alice: Any, release: Team) -> None:
    ir = _request(release, left=timedelta(seconds=-1))
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert refused.value.code == "already_answered" and "expired at" in refused.value.message
    assert Round.objects.get(pk=ir.round_id).extensions == 0


def test_an_answered_request_is_not_extended(alice: Any, release: Team) -> None:
    ir = _request(release)
    answers.input_respond(
        input_request_id=ir.pk, user=alice, action="accept", content={"environment": "staging"}
    )
    before = _deadline(ir)
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert refused.value.code == "already_answered"
    assert _deadline(ir) == before


def test_the_extension_stops_at_the_servers_own_deadline(alice: Any, release: Team) -> None:
    ir = _request(release, extend_by=900, max_extensions=3, server_deadline=timedelta(hours=1, seconds=60))
    server_deadline = Round.objects.get(pk=ir.round_id).server_deadline
    rnd = extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert rnd.deadline == server_deadline
    assert AuditEvent.objects.get(verb="round.extended").data["seconds"] == 60
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert refused.value.code == "extension_capped"
    assert _deadline(ir) == server_deadline and Round.objects.get(pk=ir.round_id).extensions == 1


def test_another_pending_request_under_a_strict_policy_keeps_the_clock(alice: Any, release: Team) -> None:
    ir = _request(release)
    strict = Policy.objects.create(name="strict", ttl=600)
    InputRequest.objects.create(
        round_id=ir.round_id,
        key="other",
        requested_schema=factories.ENVIRONMENT_SCHEMA,
        team=release,
        policy=strict,
    )
    with pytest.raises(Conflict) as refused:
        extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert refused.value.code == "extension_not_allowed" and "strict" in refused.value.message


def test_beat_expires_an_extended_round_at_its_new_deadline(alice: Any, release: Team) -> None:
    ir = _request(release, left=timedelta(seconds=30), extend_by=900)
    extensions.round_extend(input_request_id=ir.pk, user=alice)
    now = timezone.now()
    # Past the old deadline: still open, still answerable, and escalation still runs.
    assert escalation.expire_due(now=now + timedelta(seconds=60)) == 0
    assert Round.objects.get(pk=ir.round_id).status == Round.Status.OPEN
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not answers.past_deadline(ir)
    # Past the new one: expired as ever.
    assert escalation.expire_due(now=now + timedelta(seconds=931)) == 1
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.EXPIRED


def test_escalation_runs_past_the_old_deadline(alice: Any, release: Team) -> None:
    fallback = factories.team("fallback")
    ir = _request(release, left=timedelta(seconds=30), escalate_after=60, escalation_team=fallback)
    InputRequest.objects.filter(pk=ir.pk).update(created_at=timezone.now() - timedelta(seconds=10))
    extensions.round_extend(input_request_id=ir.pk, user=alice)
    assert escalation.escalate_due(now=timezone.now() + timedelta(seconds=60)) == 1
    assert InputRequest.objects.get(pk=ir.pk).escalation_team == fallback


# --- the request page -------------------------------------------------------------------------------------


def _browser(user: Any) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def test_the_page_offers_the_extension_only_to_whom_it_is_allowed(alice: Any, release: Team) -> None:
    ir = _request(release, extend_by=900)
    page = _browser(alice).get(f"/requests/{ir.pk}/")
    assert page.status_code == 200
    assert "Add 15 minutes" in page.text and f"/requests/{ir.pk}/extend/" in page.text
    assert "The deadline is close" not in page.text

    viewer = factories.user("vera")
    Membership.objects.create(team=release, user=viewer, role=Membership.Role.VIEWER)
    seen = _browser(viewer).get(f"/requests/{ir.pk}/")
    assert seen.status_code == 200 and "data-extend-form" not in seen.text

    strict = _request(release, extend_by=None)
    assert "data-extend-form" not in _browser(alice).get(f"/requests/{strict.pk}/").text


def test_posting_the_form_extends_and_says_the_new_deadline(alice: Any, release: Team) -> None:
    ir = _request(release, extend_by=5400)
    browser = _browser(alice)
    assert "Add 1 hour 30 minutes" in browser.get(f"/requests/{ir.pk}/").text
    before = _deadline(ir)
    response = browser.post(f"/requests/{ir.pk}/extend/", follow=True)
    assert response.redirect_chain == [(f"/requests/{ir.pk}/", 302)]
    assert _deadline(ir) == before + timedelta(seconds=5400)
    assert "Deadline extended: it is now" in response.text
    assert "data-extend-form" not in response.text  # once (max_extensions 1): no more offered

    again = browser.post(f"/requests/{ir.pk}/extend/")
    assert again.status_code == 409 and "as often as the policy allows" in again.text


def test_a_viewer_or_an_outsider_cannot_extend(release: Team) -> None:
    ir = _request(release)
    before = _deadline(ir)
    viewer = factories.user("vera")
    Membership.objects.create(team=release, user=viewer, role=Membership.Role.VIEWER)
    refused = _browser(viewer).post(f"/requests/{ir.pk}/extend/")
    assert refused.status_code == 403 and "Only a reviewer" in refused.text
    assert _browser(factories.user("mallory")).post(f"/requests/{ir.pk}/extend/").status_code == 404
    assert _deadline(ir) == before


def test_the_page_warns_when_the_deadline_is_close(alice: Any, release: Team) -> None:
    # Five minutes, or a fifth of the policy's ttl when less: 100 s of a 600 s clock is close, 150 s is not.
    close = _request(release, ttl=600, left=timedelta(seconds=100))
    assert "The deadline is close" in _browser(alice).get(f"/requests/{close.pk}/").text
    not_yet = _request(release, ttl=600, left=timedelta(seconds=150))
    assert "The deadline is close" not in _browser(alice).get(f"/requests/{not_yet.pk}/").text


# --- the API ----------------------------------------------------------------------------------------------


def _api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.personal_token_create(user=user)[1]}")


def test_the_api_extends_and_refuses_with_json_errors(alice: Any, release: Team) -> None:
    ir = _request(release, extend_by=600)
    before = _deadline(ir)
    client = _api(alice)
    done = client.post(f"/api/v1/input-requests/{ir.pk}/extend")
    assert done.status_code == 200, done.content
    assert done.json() == {"id": str(ir.pk), "deadline": (before + timedelta(seconds=600)).isoformat()}

    again = client.post(f"/api/v1/input-requests/{ir.pk}/extend")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "extensions_exhausted" and again.json()["error"]["message"]

    outsider = _api(factories.user("mallory")).post(f"/api/v1/input-requests/{ir.pk}/extend")
    assert outsider.status_code == 403
    assert outsider.json()["error"]["code"] == "not_a_reviewer" and outsider.json()["error"]["message"]
    assert _deadline(ir) == before + timedelta(seconds=600)


# --- the gate page ----------------------------------------------------------------------------------------


def test_a_gate_page_offers_the_extension_and_warns_when_close(alice: Any, release: Team) -> None:
    policy = Policy.objects.create(name="gated", ttl=3600, extend_by=600)
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[{"name": "wipe", "inputSchema": {"type": "object"}}],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(
        name="wipes", server=server, tool_pattern="wipe", gate=True, team=release, policy=policy
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    call, _ = calls.call_submit(agent=agent, server_slug="deploy", tool="wipe", arguments={"b": 1})
    ir = InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE)
    assert ir.policy == policy
    Round.objects.filter(pk=ir.round_id).update(deadline=timezone.now() + timedelta(seconds=120))
    browser = _browser(alice)
    page = browser.get(f"/requests/{ir.pk}/")
    assert "data-gate" in page.text and "Add 10 minutes" in page.text
    assert "The deadline is close" in page.text
    before = _deadline(ir)
    response = browser.post(f"/requests/{ir.pk}/extend/", follow=True)
    assert response.redirect_chain == [(f"/requests/{ir.pk}/", 302)]
    assert _deadline(ir) == before + timedelta(seconds=600)
    assert "The deadline is close" not in response.text and "data-extend-form" not in response.text
