"""A url-mode request is made for one person (its assignee). When that person can no longer answer it (their
account deleted or deactivated), it ends as an expiry ends a request, under the round's expiry policy:
``cancel`` resumes the call once nothing else waits, ``abandon`` abandons the call at once."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import (
    AuditEvent,
    InputRequest,
    Membership,
    Notification,
    Policy,
    Round,
    RoutingRule,
    Team,
    ToolCall,
)
from approvals.services import escalation
from approvals.services.rounds import round_open
from tests import factories

pytestmark = pytest.mark.django_db

LINK = "https://auth.example.com/device?code=carol-only"


def url_round(*, on_expiry: str = "", with_form: bool = False) -> tuple[Any, Any, Round]:
    alice, carol = factories.user("alice"), factories.user("carol")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (carol, Membership.Role.REVIEWER))
    policy = Policy.objects.create(name="sign-in", on_expiry=on_expiry) if on_expiry else None
    server = factories.server("deploy", default_team=release)
    call = factories.call(server, on_behalf_of=carol)
    rnd = factories.open_round(call, keys=("environment",) if with_form else (), team_=release)
    rnd.input_requests.update(policy=policy)
    InputRequest.objects.create(
        round=rnd,
        key="sign_in",
        mode=InputRequest.Mode.URL,
        message="Sign in",
        url=LINK,
        team=release,
        policy=policy,
        assignee=carol,
        routing={"assignee": "carol"},
    )
    return alice, carol, rnd


@pytest.mark.parametrize("with_form", [False, True])
def test_an_abandon_policy_abandons_the_call_when_the_assignee_is_deleted(with_form: bool) -> None:
    _, carol, rnd = url_round(on_expiry="abandon", with_form=with_form)

    carol.delete()

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.CLOSED and rnd.outcome == Round.Outcome.ABANDONED
    call = ToolCall.objects.get(pk=rnd.call_id)
    assert call.status == ToolCall.Status.EXPIRED and call.error["code"] == "expired"
    # The call takes no answer any more: nothing of its round is left waiting for the team.
    assert not rnd.input_requests.pending().exists()
    link = rnd.input_requests.get(key="sign_in")
    assert link.status == InputRequest.Status.EXPIRED and link.action == InputRequest.Action.CANCEL
    reasons = dict(AuditEvent.objects.filter(verb="input.expired").values_list("data__key", "data__reason"))
    assert reasons["sign_in"] == escalation.ASSIGNEE_DELETED
    if with_form:
        assert reasons["environment"] == escalation.ABANDONED_WITH
    assert AuditEvent.objects.filter(verb="call.expired", call_id=rnd.call_id).count() == 1
    assert audit.verify().ok


def test_a_cancel_policy_still_resumes_the_call_when_the_assignee_is_deleted() -> None:
    _, carol, rnd = url_round(on_expiry="cancel")

    carol.delete()

    rnd.refresh_from_db()
    assert rnd.status == Round.Status.READY and rnd.outcome == Round.Outcome.EXPIRED
    assert ToolCall.objects.get(pk=rnd.call_id).status == ToolCall.Status.RESUMING


def test_deactivating_the_assignee_ends_their_link_as_deleting_them_does() -> None:
    _, carol, rnd = url_round()

    carol.is_active = False
    carol.save()

    link = rnd.input_requests.get(key="sign_in")
    assert link.status == InputRequest.Status.EXPIRED and link.action == InputRequest.Action.CANCEL
    event = AuditEvent.objects.get(verb="input.expired", input_request_id=link.pk)
    assert event.data["reason"] == escalation.ASSIGNEE_DEACTIVATED
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.READY and rnd.outcome == Round.Outcome.EXPIRED
    assert ToolCall.objects.get(pk=rnd.call_id).status == ToolCall.Status.RESUMING
    assert audit.verify().ok


def test_deactivating_the_assignee_under_an_abandon_policy_abandons_the_call() -> None:
    _, carol, rnd = url_round(on_expiry="abandon", with_form=True)

    carol.is_active = False
    carol.save(update_fields=["is_active"])

    rnd.refresh_from_db()
    assert rnd.outcome == Round.Outcome.ABANDONED
    assert ToolCall.objects.get(pk=rnd.call_id).status == ToolCall.Status.EXPIRED


def test_a_deactivation_behind_djangos_back_is_found_by_the_sweep() -> None:
    _, carol, rnd = url_round(with_form=True)
    get_user_model().objects.filter(pk=carol.pk).update(is_active=False)
    assert rnd.input_requests.get(key="sign_in").status == InputRequest.Status.PENDING

    escalation.expire_due(now=timezone.now())

    assert rnd.input_requests.get(key="sign_in").status == InputRequest.Status.EXPIRED
    # The team's own question still waits for the team.
    assert rnd.input_requests.get(key="environment").status == InputRequest.Status.PENDING
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.OPEN


def test_saving_an_active_assignee_or_another_user_leaves_the_link_waiting() -> None:
    alice, carol, rnd = url_round()

    carol.first_name = "Carol"
    carol.save()
    alice.is_active = False
    alice.save()
    escalation.expire_due(now=timezone.now())

    link = rnd.input_requests.get(key="sign_in")
    assert link.status == InputRequest.Status.PENDING and link.assignee_id == carol.pk


def _link_asked(*, on_expiry: str = "") -> tuple[Any, ToolCall]:
    """A call made on behalf of carol, running, whose server is about to ask her to sign in."""
    alice, carol = factories.user("alice"), factories.user("carol")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server("deploy", default_team=release)
    if on_expiry:
        policy = Policy.objects.create(name="sign-in", on_expiry=on_expiry)
        RoutingRule.objects.create(position=1, name="all", tool_pattern="*", team=release, policy=policy)
    call = factories.call(server, on_behalf_of=carol, status=ToolCall.Status.AWAITING_INPUT)
    with transaction.atomic():
        audit.record(
            actor=Actor.system(),
            verb="call.submitted",
            call=call,
            data={"tool": call.tool, "arguments": call.arguments, "on_behalf_of": "carol", "channel": "api"},
        )
    return carol, call


def _ask(call: ToolCall, *, with_form: bool = False) -> Round:
    requests: dict[str, Any] = {
        "sign_in": {
            "method": "elicitation/create",
            "params": {"mode": "url", "message": "Sign in", "url": LINK},
        }
    }
    if with_form:
        params = {"mode": "form", "message": "Pick", "requestedSchema": factories.ENVIRONMENT_SCHEMA}
        requests["environment"] = {"method": "elicitation/create", "params": params}
    call = ToolCall.objects.select_related("server", "on_behalf_of").get(pk=call.pk)
    with transaction.atomic():
        return round_open(
            call=call,
            input_requests=requests,
            raw={"resultType": "input_required"},
            request_state=None,
            received_at=timezone.now(),
        )


def test_a_link_asked_for_a_person_deleted_since_the_call_began_is_not_given_to_their_team() -> None:
    carol, call = _link_asked()
    Team.objects.filter(slug="release").update(chat_webhook_url="https://chat.example/hooks/release")
    carol.delete()  # the call goes on, made for no one the hub knows now

    rnd = _ask(call, with_form=True)

    link = rnd.input_requests.get(key="sign_in")
    assert link.status == InputRequest.Status.EXPIRED and link.action == InputRequest.Action.CANCEL
    assert link.routing["assignee"] == "carol"  # the page says it was made for a user since deleted
    event = AuditEvent.objects.get(verb="input.expired", input_request_id=link.pk)
    assert event.data["reason"] == escalation.ASSIGNEE_DELETED
    # No reviewer can open it, and the team's own question still waits for the team.
    alice = get_user_model().objects.get(username="alice")
    assert not InputRequest.objects.pending().filter(key="sign_in").exists()
    page = Client()
    page.force_login(alice)
    assert LINK not in page.get(f"/requests/{link.pk}/").content.decode()
    assert rnd.input_requests.get(key="environment").status == InputRequest.Status.PENDING
    assert Round.objects.get(pk=rnd.pk).status == Round.Status.OPEN
    # The team is told of its own question only.
    told = set(Notification.objects.filter(event="routed").values_list("input_request__key", flat=True))
    assert told == {"environment"}


def test_a_link_asked_for_a_deactivated_person_ends_as_it_opens() -> None:
    carol, call = _link_asked()
    carol.is_active = False
    carol.save()

    rnd = _ask(call)

    link = rnd.input_requests.get(key="sign_in")
    assert link.status == InputRequest.Status.EXPIRED and link.assignee_id == carol.pk
    event = AuditEvent.objects.get(verb="input.expired", input_request_id=link.pk)
    assert event.data["reason"] == escalation.ASSIGNEE_DEACTIVATED
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.READY and rnd.outcome == Round.Outcome.EXPIRED
    assert ToolCall.objects.get(pk=call.pk).status == ToolCall.Status.RESUMING
    assert audit.verify().ok


def test_a_link_asked_for_a_deleted_person_under_an_abandon_policy_abandons_the_call() -> None:
    carol, call = _link_asked(on_expiry="abandon")
    carol.delete()

    rnd = _ask(call, with_form=True)

    assert rnd.status == Round.Status.CLOSED and rnd.outcome == Round.Outcome.ABANDONED
    assert ToolCall.objects.get(pk=call.pk).status == ToolCall.Status.EXPIRED
    assert not rnd.input_requests.pending().exists()
