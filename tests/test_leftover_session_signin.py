"""A policy's "recent sign-in" is the sign-in of the session the answer comes with, not the reviewer's latest
sign-in anywhere: a sign-in on a phone a minute ago must not make a week-old browser session fresh. Answers
made with a personal token (no session) keep being judged by the user's last sign-in (on the real
PostgreSQL; sessions in its session table, as the hub keeps them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client, RequestFactory
from django.utils import timezone

from approvals import permissions
from approvals.models import AuditEvent, InputRequest, Membership, Policy
from approvals.services import answers
from approvals.services.errors import Forbidden
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def risky() -> dict[str, Any]:
    """A request routed to alice's team under a policy that wants a sign-in within ten minutes."""
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    call = factories.call(factories.server())
    rnd = factories.open_round(call, team_=release)
    policy = Policy.objects.create(name="high risk", risk="high", reauth_within=600)
    InputRequest.objects.filter(round=rnd).update(policy=policy)
    return {"alice": alice, "request": InputRequest.objects.get(round=rnd)}


def signed_in_session(username: str) -> str:
    """Sign in on the sign-in page, as a browser does; the key of the session it made."""
    client = Client()
    response = client.post("/accounts/login/", {"username": username, "password": f"pw-{username}"})
    assert response.status_code == 302, response.content[:300]
    return str(client.session.session_key)


def age(session_key: str, by: timedelta) -> None:
    """Time passes for this session alone: its recorded sign-in moves back by `by`."""
    store = SessionStore(session_key=session_key)
    store[permissions.SIGNED_IN_AT] -= by.total_seconds()
    store.save()


def answering_user(session_key: str) -> Any:
    """The user of a request made with this session, as the pages and the API's session auth hand it to the
    services: loaded from the session, then told which session it came with."""
    request = RequestFactory().post("/")
    request.session = SessionStore(session_key=session_key)
    request.user = get_user(request)
    assert request.user.is_authenticated
    permissions.remember_session(request)
    return request.user


def accept(ir: InputRequest, user: Any) -> InputRequest:
    return answers.input_respond(
        input_request_id=ir.pk, user=user, action="accept", content={"environment": "staging"}
    )


def test_a_sign_in_records_its_time_in_its_own_session(risky: dict[str, Any]) -> None:
    before = timezone.now().timestamp()
    key = signed_in_session("alice")
    recorded = SessionStore(session_key=key).load()[permissions.SIGNED_IN_AT]
    assert before <= recorded <= timezone.now().timestamp()


def test_an_old_browser_session_is_not_made_fresh_by_a_sign_in_elsewhere(risky: dict[str, Any]) -> None:
    browser = signed_in_session("alice")
    age(browser, timedelta(days=7))
    phone = signed_in_session("alice")  # a minute ago, on another device: last_login is now
    risky["alice"].refresh_from_db()
    assert risky["alice"].last_login > timezone.now() - timedelta(minutes=1)

    with pytest.raises(Forbidden) as refused:
        accept(risky["request"], answering_user(browser))
    assert refused.value.code == "reauth_required"
    assert AuditEvent.objects.filter(verb="input.refused", data__code="reauth_required").count() == 1
    assert InputRequest.objects.get(pk=risky["request"].pk).status == InputRequest.Status.PENDING

    answered = accept(risky["request"], answering_user(phone))
    assert answered.status == InputRequest.Status.ANSWERED


def test_a_session_signed_in_before_the_hub_recorded_it_must_sign_in_again(risky: dict[str, Any]) -> None:
    browser = signed_in_session("alice")
    store = SessionStore(session_key=browser)
    del store[permissions.SIGNED_IN_AT]  # as a session made by the previous release holds it
    store.save()

    with pytest.raises(Forbidden) as refused:
        accept(risky["request"], answering_user(browser))
    assert refused.value.code == "reauth_required"


def test_a_fresh_session_answers_though_the_users_last_sign_in_is_older(risky: dict[str, Any]) -> None:
    """The session decides both ways: its own recent sign-in is enough."""
    browser = signed_in_session("alice")
    type(risky["alice"]).objects.filter(pk=risky["alice"].pk).update(
        last_login=timezone.now() - timedelta(days=7)
    )
    assert accept(risky["request"], answering_user(browser)).status == InputRequest.Status.ANSWERED


def test_a_personal_token_is_judged_by_the_users_last_sign_in(risky: dict[str, Any]) -> None:
    """No session: as documented, the user's last sign-in anywhere (the token's user is read as is)."""
    alice = risky["alice"]
    alice.last_login = timezone.now() - timedelta(hours=2)
    alice.save(update_fields=["last_login"])
    with pytest.raises(Forbidden) as refused:
        accept(risky["request"], type(alice).objects.get(pk=alice.pk))
    assert refused.value.code == "reauth_required"

    alice.last_login = timezone.now()
    alice.save(update_fields=["last_login"])
    answered = accept(risky["request"], type(alice).objects.get(pk=alice.pk))
    assert answered.status == InputRequest.Status.ANSWERED


def test_over_the_api_and_the_page_an_old_session_is_refused_and_a_fresh_one_answers(
    risky: dict[str, Any],
) -> None:
    """End to end: the API's session auth and the request page hand the services the session's sign-in."""
    old, fresh = Client(enforce_csrf_checks=False), Client(enforce_csrf_checks=False)
    old.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    age(str(old.session.session_key), timedelta(days=7))
    fresh.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})  # last_login: now
    ir = risky["request"]
    answer = {"action": "accept", "content": {"environment": "staging"}}

    api = old.post(f"/api/v1/input-requests/{ir.pk}/respond", answer, content_type="application/json")
    assert api.status_code == 403, api.content[:300]
    assert api.json()["error"]["code"] == "reauth_required"
    page = old.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-environment": "staging"})
    assert page.status_code == 403, page.content[:300]
    assert "sign in again" in page.content.decode()
    assert InputRequest.objects.get(pk=ir.pk).status == InputRequest.Status.PENDING

    api = fresh.post(f"/api/v1/input-requests/{ir.pk}/respond", answer, content_type="application/json")
    assert api.status_code == 200, api.content[:300]
    assert InputRequest.objects.get(pk=ir.pk).status == InputRequest.Status.ANSWERED
