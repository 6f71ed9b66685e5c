"""The API's contract as a careless or hostile client meets it: the OpenAPI document's and the docs page's
addresses take GET and HEAD only, and a JSON body sent under a form's Content-Type (``curl -d '{...}'``) is
read as the JSON it is, not as a form that names none of its fields."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import InputRequest, Membership, Policy, Round
from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db

FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize("path", ["/api/v1/openapi.json", "/api/v1/docs"])
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "BREW"])
def test_the_documents_take_get_and_head_only(path: str, method: str) -> None:
    """As every address the API reads: another method is a JSON 405 naming GET and HEAD, not the document
    again, nor (for a script's cookie-less POST) the site's HTML page about a CSRF cookie."""
    client = Client(enforce_csrf_checks=True)
    refused = client.generic(method, path)
    assert refused.status_code == 405, refused.content[:200]
    assert refused["Content-Type"].startswith("application/json")
    assert refused.json()["error"]["code"] == "method_not_allowed"
    assert [m.strip() for m in refused["Allow"].split(",")] == ["GET", "HEAD"]
    assert client.get(path).status_code == 200
    head = client.head(path)
    assert head.status_code == 200 and head.content == b""


@pytest.fixture
def extendable() -> tuple[Client, InputRequest]:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    policy = Policy.objects.create(name="extendable", ttl=3600, extend_by=900, max_extensions=3)
    rnd = factories.open_round(
        factories.call(factories.server("deploy", default_team=release)), team_=release
    )
    InputRequest.objects.filter(round=rnd).update(policy=policy)
    Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() + timedelta(minutes=3))
    ir = InputRequest.objects.select_related("round").get(round=rnd)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.personal_token_create(user=alice)[1]}")
    return client, ir


def test_json_posted_as_a_form_keeps_its_seen_deadline(extendable: tuple[Client, InputRequest]) -> None:
    """``curl -d '{"seen": ...}'`` without a JSON Content-Type: the retry of an extension that went through
    is told so (409), instead of extending the deadline a second time."""
    client, ir = extendable
    seen = ir.round.deadline
    url = f"/api/v1/input-requests/{ir.pk}/extend"
    body = json.dumps({"seen": seen.isoformat()})
    first = client.post(url, body, content_type=FORM)
    assert first.status_code == 200, first.content
    assert first.json()["deadline"] == (seen + timedelta(seconds=900)).isoformat()
    again = client.post(url, body, content_type=FORM)
    assert again.status_code == 409, again.content
    assert again.json()["error"]["code"] == "already_extended"
    rnd = Round.objects.get(pk=ir.round_id)
    assert (rnd.extensions, rnd.deadline) == (1, seen + timedelta(seconds=900))


@pytest.mark.parametrize(
    ("body", "field"),
    [('{"seen": "2026-12-07T12:00:00"}', "seen"), ('["seen"]', "body"), ('{"seen": 1, "seen": 2}', "body")],
)
def test_json_posted_as_a_form_is_checked_as_json(
    extendable: tuple[Client, InputRequest], body: str, field: str
) -> None:
    """Such a body gets the 400s of any JSON body (no zone, not an object, a member twice), and extends
    nothing."""
    client, ir = extendable
    refused: Any = client.post(f"/api/v1/input-requests/{ir.pk}/extend", body, content_type=FORM)
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert error["code"] == "invalid_body" and field in error["fields"]
    assert Round.objects.get(pk=ir.round_id).extensions == 0


def test_a_form_is_still_read_as_one(extendable: tuple[Client, InputRequest]) -> None:
    client, ir = extendable
    seen = ir.round.deadline
    url = f"/api/v1/input-requests/{ir.pk}/extend"
    assert client.post(url, {"seen": seen.isoformat()}).status_code == 200  # multipart: the test client's
    again = client.post(url, f"seen={seen.isoformat().replace('+', '%2B')}", content_type=FORM)
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_extended"


IR = {
    "env": {
        "method": "elicitation/create",
        "params": {"message": "Where?", "requestedSchema": {"type": "object", "properties": {}}},
    }
}


@pytest.mark.parametrize(
    ("path", "extra", "status"), [("/api/v1/calls", {}, 202), ("/api/v1/relays", {"input_requests": IR}, 201)]
)
def test_null_arguments_are_none_given(path: str, extra: dict[str, Any], status: int) -> None:
    """``"arguments": null`` (a Go client's nil map) is a call without arguments, as the field left out is;
    a retry under the same key with ``{}`` repeats it rather than being refused as another request."""
    server = factories.server("deploy")
    _, token = factories.agent("bot", servers=[server])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"server": "deploy", "tool": "ping", "idempotency_key": "k1", **extra}
    made = client.post(path, json.dumps({**body, "arguments": None}), content_type="application/json")
    assert made.status_code == status, made.content
    assert client.get(made.json()["url"]).json()["arguments"] == {}
    again = client.post(path, json.dumps({**body, "arguments": {}}), content_type="application/json")
    assert again.status_code == 200 and again.json()["id"] == made.json()["id"]
    wrong = client.post(path, json.dumps({**body, "arguments": []}), content_type="application/json")
    assert wrong.status_code == 400 and "arguments" in wrong.json()["error"]["fields"]
