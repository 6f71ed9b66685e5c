"""The HTTP contract (docs/api.md): auth, errors as JSON, idempotency, permissions, validation of answers."""

from __future__ import annotations

import json

import pytest

from approvals.models import (
    AgentClient,
    AuditEvent,
    Decision,
    InputRequest,
    Membership,
    PersonalToken,
    ToolCall,
)
from approvals.services import tokens
from tests import factories
from tests.hub import Agent, Reviewer, off_the_loop

pytestmark = pytest.mark.django_db

MEETING = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 3},
        "attendees": {"type": "integer", "minimum": 2, "maximum": 50},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["title", "attendees"],
}


@pytest.fixture
def deploy():
    return factories.server("deploy")


@pytest.fixture
def agent(deploy) -> Agent:
    _, token = factories.agent("ci-bot", servers=[deploy])
    return Agent(token)


@pytest.fixture
def alice():
    return factories.user("alice")


@pytest.fixture
def release(alice, deploy):
    team = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy.default_team = team
    deploy.save()
    return team


@pytest.fixture
def reviewer(alice) -> Reviewer:
    _, token = tokens.personal_token_create(user=alice)
    return Reviewer(token)


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["content-type"].startswith("application/json")
    body = response.json()["error"]
    assert body["code"] == code
    assert body["message"]
    return body


def test_a_call_is_queued_and_readable_by_its_agent(agent: Agent) -> None:
    response = agent.post(
        "/calls", {"server": "deploy", "tool": "create_deployment", "arguments": {"branch": "x"}}
    )
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    assert body["url"] == f"/api/v1/calls/{body['id']}"
    detail = agent.get(f"/calls/{body['id']}").json()
    assert detail["arguments"] == {"branch": "x"}
    assert detail["rounds"] == [] and detail["result"] is None and detail["error"] is None


def test_arguments_pass_through_untouched(agent: Agent) -> None:
    arguments = {"a": None, "b": False, "c": "", "$ref": "#/x", "nested": {"d": [1, 2.5, "e"]}}
    call_id = agent.call("t", arguments, server="deploy")
    assert ToolCall.objects.get(pk=call_id).arguments == arguments


def test_the_same_idempotency_key_returns_the_same_call(agent: Agent) -> None:
    body = {"server": "deploy", "tool": "create_deployment", "idempotency_key": "deploy-42"}
    first = agent.post("/calls", body)
    second = agent.post("/calls", body)
    assert (first.status_code, second.status_code) == (202, 200)
    assert first.json()["id"] == second.json()["id"]
    assert ToolCall.objects.count() == 1


def test_an_agent_cannot_call_a_server_it_was_not_given(agent: Agent) -> None:
    factories.server("payments")
    response = agent.post("/calls", {"server": "payments", "tool": "refund"})
    assert_error(response, 404, "unknown_server")  # as one that does not exist: no slug is given away
    assert ToolCall.objects.count() == 0


def test_unknown_server_is_404(agent: Agent) -> None:
    assert_error(agent.post("/calls", {"server": "nope", "tool": "x"}), 404, "unknown_server")


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        json.dumps({"tool": "x"}),
        json.dumps({"server": "deploy", "tool": "x", "arguments": [1]}),
        "[]",
    ],
)
def test_malformed_bodies_get_a_clear_400(agent: Agent, body: str) -> None:
    assert_error(agent.post("/calls", body), 400, "invalid_body")
    assert ToolCall.objects.count() == 0


def test_no_or_bad_token_is_401() -> None:
    assert_error(Agent("eha_wrong").post("/calls", {"server": "deploy", "tool": "x"}), 401, "unauthorized")
    assert_error(Reviewer("").get("/inbox"), 401, "unauthorized")


def test_a_reviewer_token_cannot_act_as_an_agent(reviewer: Reviewer) -> None:
    """Refused as the wrong kind of token (403), not as an unknown one (401: renew it)."""
    body = assert_error(reviewer.post("/calls", {"server": "deploy", "tool": "x"}), 403, "wrong_token_kind")
    assert "personal token" in body["message"] and "agent's token" in body["message"]
    assert not ToolCall.objects.exists()


def test_an_agent_token_cannot_act_as_a_reviewer(agent: Agent, deploy, release) -> None:
    ir = form_request(deploy, release)
    for response in (
        agent.get("/inbox"),
        agent.post(f"/input-requests/{ir.pk}/respond", {"action": "decline"}),
    ):
        body = assert_error(response, 403, "wrong_token_kind")
        assert "agent's token" in body["message"]
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING


def test_callbacks_must_be_https_outside_development(agent: Agent, settings) -> None:
    settings.ELICIT_WEBHOOK_ALLOW_HTTP = False
    response = agent.post(
        "/calls", {"server": "deploy", "tool": "x", "callback_url": "http://example.com/hook"}
    )
    assert_error(response, 400, "invalid_callback_url")


def test_an_agent_sees_only_its_own_calls(agent: Agent, deploy) -> None:
    call_id = agent.call("x", server="deploy")
    _, other_token = factories.agent("other", servers=[deploy])
    assert_error(Agent(other_token).get(f"/calls/{call_id}"), 404, "not_found")


def test_tokens_are_stored_hashed() -> None:
    created, token = tokens.agent_create(name="hashed", servers=[])
    _, personal = tokens.personal_token_create(user=factories.user("bob"))
    row = AgentClient.objects.get(pk=created.pk)
    assert row.token_hash == tokens.hash_token(token) and token not in row.token_hash
    assert PersonalToken.objects.get().token_hash == tokens.hash_token(personal)


NO_CALL = "00000000-0000-0000-0000-000000000000"  # authenticated first, then 404


def test_last_used_at_is_written_at_most_once_a_minute(agent: Agent, reviewer: Reviewer, alice) -> None:
    agent.get(f"/calls/{NO_CALL}")
    reviewer.get("/inbox")
    row = AgentClient.objects.get(name="ci-bot")
    personal = PersonalToken.objects.get(user=alice)
    assert row.last_used_at is not None and personal.last_used_at is not None
    first, first_personal = row.last_used_at, personal.last_used_at
    agent.get(f"/calls/{NO_CALL}")
    reviewer.get("/inbox")
    assert AgentClient.objects.get(pk=row.pk).last_used_at == first
    assert PersonalToken.objects.get(pk=personal.pk).last_used_at == first_personal
    # Older than the precision: the next request records it again.
    older = first - tokens.LAST_USED_PRECISION
    AgentClient.objects.filter(pk=row.pk).update(last_used_at=older)
    PersonalToken.objects.filter(pk=personal.pk).update(last_used_at=older)
    agent.get(f"/calls/{NO_CALL}")
    reviewer.get("/inbox")
    assert AgentClient.objects.get(pk=row.pk).last_used_at > first
    assert PersonalToken.objects.get(pk=personal.pk).last_used_at > first_personal


def form_request(deploy, release, schema=MEETING, key="meeting"):
    call = factories.call(deploy)
    rnd = factories.open_round(call, keys=(), team_=release)
    return InputRequest.objects.create(
        round=rnd, key=key, message="Plan it", requested_schema=schema, team=release
    )


def test_the_inbox_lists_what_the_reviewer_may_answer(deploy, release, reviewer: Reviewer) -> None:
    ir = form_request(deploy, release)
    other_team = factories.team("payments")
    form_request(factories.server("pay"), other_team, key="other")
    items = reviewer.inbox()
    assert [i["id"] for i in items] == [str(ir.pk)]
    item = items[0]
    assert item["server"] == "deploy" and item["server_name"] == deploy.name
    assert item["requested_schema"] == MEETING
    assert "request_state" not in json.dumps(items) and "requestState" not in json.dumps(items)


def test_an_invalid_answer_is_422_per_field_and_nothing_is_recorded(
    deploy, release, reviewer: Reviewer
) -> None:
    ir = form_request(deploy, release)
    response = reviewer.respond(str(ir.pk), "accept", {"title": "ok", "attendees": "2o", "email": "nope"})
    body = assert_error(response, 422, "invalid_answer")
    assert set(body["fields"]) == {"title", "attendees", "email"}
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING
    assert not Decision.objects.exists()
    assert not AuditEvent.objects.filter(verb="input.answered").exists()


def test_a_valid_answer_is_recorded_once(deploy, release, reviewer: Reviewer, alice) -> None:
    ir = form_request(deploy, release)
    content = {"title": "Release review", "attendees": 5}
    response = reviewer.respond(str(ir.pk), "accept", content)
    assert response.status_code == 200
    assert response.json() == {"id": str(ir.pk), "status": "answered", "action": "accept"}
    ir.refresh_from_db()
    assert (ir.content, ir.answered_by) == (content, alice)
    assert ir.round.status == "ready"
    again = reviewer.respond(str(ir.pk), "decline")
    body = assert_error(again, 409, "already_answered")
    assert body["message"].startswith("You already accepted this request at ")  # alice herself is told so


def test_decline_carries_its_reason_and_no_content(deploy, release, reviewer: Reviewer) -> None:
    ir = form_request(deploy, release)
    assert_error(reviewer.respond(str(ir.pk), "decline", {"title": "x"}), 400, "invalid_body")
    assert reviewer.respond(str(ir.pk), "decline", reason="wrong branch").status_code == 200
    ir.refresh_from_db()
    assert ir.as_input_response() == {"action": "decline"}
    assert ir.reason == "wrong branch"


def test_someone_outside_the_team_cannot_answer(deploy, release) -> None:
    ir = form_request(deploy, release)
    _, token = tokens.personal_token_create(user=factories.user("mallory"))
    assert_error(
        Reviewer(token).respond(str(ir.pk), "accept", {"title": "abc", "attendees": 3}), 403, "not_a_reviewer"
    )
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING


def test_openapi_document_and_docs_page_are_served(client) -> None:
    doc = client.get("/api/v1/openapi.json").json()
    for path in [
        "/api/v1/calls",
        "/api/v1/calls/{call_id}",
        "/api/v1/relays",
        "/api/v1/inbox",
        "/api/v1/input-requests/{request_id}/respond",
    ]:
        assert path in doc["paths"]
    assert client.get("/api/v1/docs").status_code == 200


def test_the_session_api_needs_csrf(client, alice, deploy, release) -> None:
    ir = form_request(deploy, release)
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    response = browser.post(
        f"/api/v1/input-requests/{ir.pk}/respond", {"action": "cancel"}, content_type="application/json"
    )
    assert response.status_code in (401, 403)
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING


# --- errors the framework answers on its own are the API's errors too -----------------------------------


def test_an_unknown_api_address_is_a_json_404(agent: Agent) -> None:
    for path in ("/nope", "/calls/00000000-0000-0000-0000-000000000000/"):  # no route; a trailing slash
        assert_error(agent.get(path), 404, "not_found")


def test_a_method_an_api_address_does_not_take_is_a_json_405(agent: Agent) -> None:
    response = off_the_loop(agent.client.delete, "/api/v1/calls")
    body = assert_error(response, 405, "method_not_allowed")
    assert "DELETE" in body["message"] and "POST" in response["Allow"]


def test_a_bad_parameter_is_named_as_a_parameter_not_the_body(agent: Agent) -> None:
    call_id = agent.call("create_deployment", server="deploy")
    body = assert_error(agent.get(f"/calls/{call_id}", wait="soon"), 400, "invalid_body")
    assert body["message"] == "A parameter of the request is invalid." and "wait" in body["fields"]
    malformed = assert_error(agent.post("/calls", {"server": "deploy"}), 400, "invalid_body")
    assert malformed["message"] == "The request body is malformed."


def test_an_idempotency_key_used_for_a_call_is_refused_for_a_relay(agent: Agent) -> None:
    call = agent.post("/calls", {"server": "deploy", "tool": "create_deployment", "idempotency_key": "k-1"})
    assert call.status_code == 202
    relay = {
        "server": "deploy",
        "tool": "create_deployment",
        "arguments": {},
        "input_requests": {"ok": {"method": "elicitation/create", "params": {"message": "OK?"}}},
        "idempotency_key": "k-1",
    }
    body = assert_error(agent.post("/relays", relay), 409, "idempotency_key_reused")
    assert "call" in body["message"]
    assert ToolCall.objects.count() == 1
    # and the other way round
    relay["idempotency_key"] = "k-2"
    assert agent.post("/relays", relay).status_code == 201
    again = agent.post("/calls", {"server": "deploy", "tool": "create_deployment", "idempotency_key": "k-2"})
    assert "relay" in assert_error(again, 409, "idempotency_key_reused")["message"]


def test_a_late_answer_is_a_409_even_when_it_is_also_invalid(deploy, release, reviewer: Reviewer) -> None:
    ir = form_request(deploy, release)
    assert reviewer.respond(str(ir.pk), "accept", {"title": "abc", "attendees": 3}).status_code == 200
    late = reviewer.respond(str(ir.pk), "accept", {"title": "x", "attendees": "many"})
    body = assert_error(late, 409, "already_answered")
    assert body["message"].startswith("You already accepted this request at 20")
    assert body["message"].endswith(" UTC.") and ".." not in body["message"]


def test_an_inbox_item_says_who_asks(deploy, release, reviewer: Reviewer, alice) -> None:
    """A bot reviewer sees what a person sees on the card: whether the hub sends the call or an agent relays
    questions it received itself, which agent asks, and for whom."""
    asker, _ = tokens.agent_create(name="release-bot", servers=[deploy])
    call = factories.call(deploy, asker, on_behalf_of=alice)
    rnd = factories.open_round(call, keys=(), team_=release)
    InputRequest.objects.create(round=rnd, key="go", message="Go?", requested_schema=MEETING, team=release)
    relay = factories.call(deploy, asker, kind=ToolCall.Kind.RELAY)
    rnd = factories.open_round(relay, keys=(), team_=release)
    InputRequest.objects.create(round=rnd, key="ok", message="OK?", requested_schema=MEETING, team=release)
    anonymous = form_request(deploy, release, key="plain")

    shown = {item["key"]: (item["kind"], item["agent"], item["on_behalf_of"]) for item in reviewer.inbox()}
    assert shown == {
        "go": ("call", "release-bot", "alice"),
        "ok": ("relay", "release-bot", None),
        anonymous.key: ("call", None, None),
    }
