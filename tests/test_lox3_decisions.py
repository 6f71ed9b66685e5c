"""Refused grant revokes are recorded; a decision on a request decided meanwhile is told so before anything
about its reason; the API's extension can name the deadline it extends, so two at once extend once."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any
from unittest.mock import ANY

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    Grant,
    InputRequest,
    McpServer,
    Membership,
    Policy,
    Round,
    RoutingRule,
)
from approvals.services import answers, extensions, grants, tokens
from approvals.services.errors import Conflict
from tests import factories
from tests.hub import Agent, ApiClient

TOOL_DIGEST = "d" * 64
LONG = "r" * 2001


def personal(user: Any) -> ApiClient:
    return ApiClient(tokens.personal_token_create(user=user)[1])


def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()["error"]
    assert body["message"]
    return body


# --- refused revokes are recorded ---------------------------------------------------------------------------


@pytest.fixture
def granted(db: None) -> Any:
    alice, vera, olga = (factories.user(name) for name in ("alice", "vera", "olga"))
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (vera, Membership.Role.VIEWER))
    factories.team("ops", (olga, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    agent, agent_token = factories.agent("ci-bot", servers=[deploy])
    made = factories.call(deploy, agent, arguments={"env": "prod", "api_key": "s3cr3t-value"})
    grant = grants.create_from_approval(
        approver=alice, call=made, tool_digest=TOOL_DIGEST, choice={"for": "8h", "arguments": "exact"}
    )
    return alice, vera, olga, agent, agent_token, grant


def refusals(grant: Grant) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(verb="grant.refused", data__grant=str(grant.pk)).order_by("id"))


def assert_refused(event: AuditEvent, who: str, code: str) -> None:
    assert (event.actor_label, event.data["code"], event.team_slug) == (who, code, "release")
    assert event.data["tool"] == "create_deployment" and event.data["server"] == "deploy"
    assert "s3cr3t" not in json.dumps(event.data)  # the grant is named, never its arguments


def test_a_viewer_refused_a_revoke_on_the_page_is_recorded(granted) -> None:
    _, vera, _, _, _, grant = granted
    response = browser(vera).post(f"/grants/{grant.pk}/revoke/")
    assert response.status_code == 403
    (event,) = refusals(grant)
    assert_refused(event, "vera", "forbidden")
    assert event.actor_type == AuditEvent.ActorType.USER
    assert Grant.objects.get(pk=grant.pk).revoked_at is None


def test_an_outsider_refused_a_revoke_on_the_page_is_recorded_and_still_told_not_found(granted) -> None:
    _, _, olga, _, _, grant = granted
    assert browser(olga).post(f"/grants/{grant.pk}/revoke/").status_code == 404
    assert browser(olga).get(f"/grants/{grant.pk}/revoke/").status_code == 404  # a look is no attempt
    (event,) = refusals(grant)
    assert_refused(event, "olga", "not_found")


def test_refused_revokes_through_the_api_are_recorded(granted) -> None:
    _, vera, olga, agent, agent_token, grant = granted
    assert error_of(personal(vera).post(f"/grants/{grant.pk}/revoke", {}), 403)["code"] == "forbidden"
    assert error_of(personal(olga).post(f"/grants/{grant.pk}/revoke", {}), 404)["code"] == "not_found"
    assert error_of(ApiClient(agent_token).post(f"/grants/{grant.pk}/revoke", {}), 403)["code"] == "forbidden"
    viewer, outsider, bot = refusals(grant)
    assert_refused(viewer, "vera", "forbidden")
    assert_refused(outsider, "olga", "not_found")
    assert_refused(bot, "ci-bot", "forbidden")
    assert bot.actor_type == AuditEvent.ActorType.AGENT and bot.actor_id == str(agent.pk)
    assert Grant.objects.get(pk=grant.pk).revoked_at is None


def test_a_revoke_of_no_grant_records_nothing_and_an_allowed_one_no_refusal(granted) -> None:
    alice, vera, _, _, _, grant = granted
    assert error_of(personal(vera).post(f"/grants/{uuid.uuid4()}/revoke", {}), 404)["code"] == "not_found"
    assert not AuditEvent.objects.filter(verb="grant.refused").exists()
    assert personal(alice).post(f"/grants/{grant.pk}/revoke", {}).status_code == 200
    assert not AuditEvent.objects.filter(verb="grant.refused").exists()
    assert AuditEvent.objects.filter(verb="grant.revoked", data__grant=str(grant.pk)).count() == 1


# --- a decision on a request decided meanwhile: the 409 first ---------------------------------------------


@pytest.fixture
def asked(db: None) -> Any:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    rnd = factories.open_round(factories.call(factories.server("deploy")), team_=release)
    return alice, bob, rnd.input_requests.get()


def test_a_long_reason_on_an_answered_request_is_told_it_was_answered(asked) -> None:
    alice, bob, ir = asked
    answers.input_respond(input_request_id=ir.pk, user=bob, action="decline", reason="no")
    late = personal(alice).post(f"/input-requests/{ir.pk}/respond", {"action": "decline", "reason": LONG})
    body = error_of(late, 409)
    assert body["code"] == "already_answered" and "bob" in body["message"]


def test_a_long_reason_on_a_pending_request_is_still_refused_and_nothing_recorded(asked) -> None:
    alice, _, ir = asked
    refused = personal(alice).post(f"/input-requests/{ir.pk}/respond", {"action": "decline", "reason": LONG})
    body = error_of(refused, 400)
    assert body["code"] == "invalid_body" and "reason" in body["fields"]
    assert InputRequest.objects.get(pk=ir.pk).status == InputRequest.Status.PENDING
    unknown = personal(alice).post(
        f"/input-requests/{uuid.uuid4()}/respond", {"action": "decline", "reason": LONG}
    )
    assert error_of(unknown, 404)["code"] == "not_found"  # no such request is the news
    schema = Client().get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert schema["RespondIn"]["properties"]["reason"]["maxLength"] == 2000
    assert schema["DecideIn"]["properties"]["reason"]["maxLength"] == 2000


def test_a_reason_is_measured_with_each_line_break_once_as_the_page_measures_it(asked) -> None:
    """2,000 characters typed with their line breaks: a client sending each as CRLF (as a browser's form
    does) sends more characters, and the same reason is taken as it is from the page."""
    alice, _, ir = asked
    reason = "line\r\n" * 400  # 2,400 characters sent, 2,000 counted
    done = personal(alice).post(f"/input-requests/{ir.pk}/respond", {"action": "decline", "reason": reason})
    assert done.status_code == 200, done.content
    assert InputRequest.objects.get(pk=ir.pk).reason == "line\n" * 400


@pytest.fixture
def gated(db: None) -> Any:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        default_team=release,
        tools=[{"name": "deploy", "inputSchema": {"type": "object"}}],
        tools_fetched_at=timezone.now(),
    )
    RoutingRule.objects.create(
        position=1, name="gate deploys", server=server, tool_pattern="deploy", gate=True, team=release
    )
    _, agent_token = tokens.agent_create(name="ci-bot", servers=[server])
    call_id = Agent(agent_token).call("deploy", {"environment": "staging"}, server="deploy")
    ir = InputRequest.objects.get(round__call_id=uuid.UUID(call_id))
    return alice, bob, ir


def test_a_long_reason_on_a_decided_gate_is_told_it_was_decided(gated) -> None:
    alice, bob, ir = gated
    assert personal(bob).post(f"/input-requests/{ir.pk}/decide", {"decision": "approve"}).status_code == 200
    late = personal(alice).post(f"/input-requests/{ir.pk}/decide", {"decision": "decline", "reason": LONG})
    body = error_of(late, 409)
    assert body["code"] == "already_answered" and "bob" in body["message"]
    pending = error_of(personal(bob).post(f"/input-requests/{ir.pk}/decide", {"decision": "decline"}), 409)
    assert pending["code"] == "already_answered"


# --- the API's extension names the deadline it extends ------------------------------------------------------


@pytest.fixture
def extendable(db: None) -> Any:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    return alice, bob, _extendable_request(release)


def _extendable_request(release: Any) -> InputRequest:
    policy = Policy.objects.create(name="extendable", ttl=3600, extend_by=900, max_extensions=3)
    rnd = factories.open_round(
        factories.call(factories.server("deploy", default_team=release)), team_=release
    )
    InputRequest.objects.filter(round=rnd).update(policy=policy)
    Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() + timedelta(minutes=3))
    return InputRequest.objects.select_related("round").get(round=rnd)


def _extend(client: ApiClient, ir: InputRequest, body: Any) -> Any:
    return client.post(f"/input-requests/{ir.pk}/extend", body)


def test_the_deadline_seen_extends_once_and_a_repeat_is_told_already_extended(extendable) -> None:
    alice, bob, ir = extendable
    seen = ir.round.deadline
    first = _extend(personal(alice), ir, {"seen": seen.isoformat()})
    assert first.status_code == 200, first.content
    assert first.json()["deadline"] == (seen + timedelta(seconds=900)).isoformat()
    again = error_of(_extend(personal(bob), ir, {"seen": seen.isoformat()}), 409)
    assert again["code"] == "already_extended" and "already extended" in again["message"]
    rnd = Round.objects.get(pk=ir.round_id)
    assert (rnd.extensions, rnd.deadline) == (1, seen + timedelta(seconds=900))
    # What the first answer said is the deadline to extend next.
    fresh = _extend(personal(bob), ir, {"seen": first.json()["deadline"]})
    assert fresh.status_code == 200 and Round.objects.get(pk=ir.round_id).extensions == 2


def test_the_deadline_seen_may_be_in_another_zone_or_to_the_millisecond(extendable) -> None:
    """A client keeping times as JavaScript's Date does sends them back in UTC, to the millisecond."""
    alice, _, ir = extendable
    seen = ir.round.deadline.replace(microsecond=123_456)
    Round.objects.filter(pk=ir.round_id).update(deadline=seen)
    as_js = seen.astimezone(timezone.get_fixed_timezone(0)).isoformat(timespec="milliseconds")
    assert as_js.endswith(".123+00:00")
    done = _extend(personal(alice), ir, {"seen": as_js.replace("+00:00", "Z")})
    assert done.status_code == 200, done.content
    elsewhere = (seen + timedelta(seconds=900)).astimezone(timezone.get_fixed_timezone(-300)).isoformat()
    assert _extend(personal(alice), ir, {"seen": elsewhere}).status_code == 200
    assert Round.objects.get(pk=ir.round_id).extensions == 2


def test_the_page_and_the_service_take_the_deadline_seen_to_the_millisecond(extendable) -> None:
    alice, _, ir = extendable
    seen = ir.round.deadline.replace(microsecond=123_456)
    Round.objects.filter(pk=ir.round_id).update(deadline=seen)
    rnd = extensions.round_extend(input_request_id=ir.pk, user=alice, seen=seen.replace(microsecond=123_000))
    assert (rnd.extensions, rnd.deadline) == (1, seen + timedelta(seconds=900))
    with pytest.raises(Conflict) as refused:  # the deadline before: a millisecond is no tolerance for that
        extensions.round_extend(input_request_id=ir.pk, user=alice, seen=seen.replace(microsecond=123_000))
    assert refused.value.code == "already_extended"


def test_without_a_body_each_extension_adds_as_before(extendable) -> None:
    alice, _, ir = extendable
    start = ir.round.deadline
    token = tokens.personal_token_create(user=alice)[1]
    plain = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert plain.post(f"/api/v1/input-requests/{ir.pk}/extend").status_code == 200  # an empty form
    assert plain.generic("POST", f"/api/v1/input-requests/{ir.pk}/extend").status_code == 200  # no body
    assert _extend(ApiClient(token), ir, {}).status_code == 200
    rnd = Round.objects.get(pk=ir.round_id)
    assert (rnd.extensions, rnd.deadline) == (3, start + timedelta(seconds=2700))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"seen": "2026-12-07T12:00:00"}, "seen"),  # no zone: which moment is it?
        ({"seen": 1765108800}, "seen"),  # a number is not the ISO 8601 the API gives
        ({"seen": "tomorrow"}, "seen"),
        ('{"seen": "2026-12-07T12:00:00Z", "seen": null}', "body"),
        ("[]", "body"),
        ("{", None),
    ],
)
def test_a_malformed_body_is_refused_and_extends_nothing(extendable, body: Any, field: str | None) -> None:
    alice, _, ir = extendable
    refused = error_of(_extend(personal(alice), ir, body), 400)
    assert refused["code"] == "invalid_body"
    if field:
        assert field in refused["fields"]
    assert Round.objects.get(pk=ir.round_id).extensions == 0


def test_a_form_is_read_as_the_pages_form_is(extendable) -> None:
    """A form (``curl -d seen=...``, a browser's form with its CSRF token) names the deadline it saw as the
    request page's form does; a field the endpoint does not take is ignored, as it was."""
    alice, _, ir = extendable
    token = tokens.personal_token_create(user=alice)[1]
    plain = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = f"/api/v1/input-requests/{ir.pk}/extend"
    seen = ir.round.deadline.isoformat()
    assert plain.post(url, {"seen": seen}).status_code == 200
    again = plain.post(
        url, f"seen={seen.replace('+', '%2B')}", content_type="application/x-www-form-urlencoded"
    )
    assert error_of(again, 409)["code"] == "already_extended"
    assert plain.post(url, {"csrfmiddlewaretoken": "x"}).status_code == 200
    twice = plain.post(url, {"seen": [seen, "2026-12-07T12:00:00Z"]})
    assert error_of(twice, 400)["code"] == "invalid_body"
    assert "given twice" in error_of(twice, 400)["fields"]["body"]
    assert error_of(plain.post(url, {"seen": "soon"}), 400)["fields"] == {"seen": ANY}
    assert Round.objects.get(pk=ir.round_id).extensions == 2


def test_a_refused_extension_is_recorded_as_a_refused_answer_is(extendable) -> None:
    _, _, ir = extendable
    viewer, outsider = factories.user("vera"), factories.user("mallory")
    Membership.objects.create(team=ir.team, user=viewer, role=Membership.Role.VIEWER)
    assert browser(viewer).post(f"/requests/{ir.pk}/extend/").status_code == 403
    refused = error_of(_extend(personal(outsider), ir, {}), 403)
    assert refused["code"] == "not_a_reviewer"
    events = AuditEvent.objects.filter(verb="input.refused", input_request_id=ir.pk).order_by("id")
    assert [(e.actor_label, e.data) for e in events] == [
        (who, {"key": "environment", "code": "not_a_reviewer", "refused": "extend"})
        for who in ("vera", "mallory")
    ]
    assert Round.objects.get(pk=ir.round_id).extensions == 0


def test_the_document_describes_the_optional_body() -> None:
    operation = (
        Client()
        .get("/api/v1/openapi.json")
        .json()["paths"]["/api/v1/input-requests/{request_id}/extend"]["post"]
    )
    body = operation["requestBody"]
    assert body["required"] is False
    assert "seen" in body["content"]["application/json"]["schema"]["properties"]


@pytest.mark.parametrize("attempt", range(2))
def test_two_scripts_extending_the_deadline_they_both_saw_extend_it_once(live_db: None, attempt: int) -> None:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    ir = _extendable_request(release)
    seen: datetime = ir.round.deadline
    clients = [personal(alice), personal(bob)]
    barrier = threading.Barrier(2)
    statuses: list[int] = [0, 0]

    def run(index: int) -> None:
        try:
            barrier.wait()
            statuses[index] = _extend(clients[index], ir, {"seen": seen.isoformat()}).status_code
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [200, 409]
    rnd = Round.objects.get(pk=ir.round_id)
    assert (rnd.extensions, rnd.deadline) == (1, seen + timedelta(seconds=900))
