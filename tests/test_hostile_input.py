"""Hostile bodies, through the API and the dashboard: each answered in the error contract, nothing stored.

A table of bodies PostgreSQL or the hub's own code would choke on (NUL, lone surrogates, NaN and Infinity,
deep nesting, a body over the size limit, broken JSON), each sent where an agent or a reviewer can send it.
The API answers JSON ``{"error": ...}`` with 400 or 413; the dashboard a readable page or the form with the
problem shown. Row and audit counts are the same after as before: nothing is stored half-way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings

from approvals import safejson
from approvals.models import AuditEvent, Decision, InputRequest, Round, ToolCall
from approvals.services import tokens
from tests import factories
from tests.hub import Agent, Reviewer

pytestmark = pytest.mark.django_db

NOTE_SCHEMA = {
    "type": "object",
    "properties": {"note": {"type": "string"}, "count": {"type": "number"}},
}
DEEP = '{"a":' * 500 + "1" + "}" * 500  # about 3 KB
BIG = "x" * (10 * 1024 * 1024)  # 10 MB


def _call(arguments: str = "{}", extra: str = "") -> str:
    return '{"server": "deploy", "tool": "create_deployment", "arguments": ' + arguments + extra + "}"


def _relay(requests: str) -> str:
    return '{"server": "elsewhere", "tool": "t", "input_requests": ' + requests + "}"


def _form_request(message: str) -> str:
    return (
        '{"k": {"method": "elicitation/create", "params": {"mode": "form", "message": '
        + message
        + ', "requestedSchema": {"type": "object", "properties": {}}}}}'
    )


# (name, path kind, raw body, expected status)
API_BODIES: list[tuple[str, str, str | bytes, int]] = [
    ("nul in an argument", "calls", _call('{"branch": "ma\\u0000in"}'), 400),
    ("nul in an argument's key", "calls", _call('{"bra\\u0000nch": "main"}'), 400),
    ("lone surrogate in an argument", "calls", _call('{"branch": "\\ud800"}'), 400),
    ("low surrogate alone in a nested list", "calls", _call('{"a": [["\\udfff"]]}'), 400),
    ("NaN in arguments", "calls", _call('{"replicas": NaN}'), 400),
    ("Infinity in arguments", "calls", _call('{"replicas": Infinity}'), 400),
    ("-Infinity in arguments", "calls", _call('{"replicas": -Infinity}'), 400),
    ("arguments nested 500 deep", "calls", _call(DEEP), 400),
    ("nul in the idempotency key", "calls", _call("{}", ', "idempotency_key": "k\\u0000"'), 400),
    ("nul in the tool name", "calls", '{"server": "deploy", "tool": "t\\u0000", "arguments": {}}', 400),
    ("a 10 MB body", "calls", _call(json.dumps({"blob": BIG})), 413),
    ("not JSON", "calls", '{"server": ', 400),
    ("not UTF-8", "calls", b'{"server": "deploy", "tool": "\xed\xa0\x80", "arguments": {}}', 400),
    ("nul in a relayed message", "relays", _relay(_form_request('"Pick\\u0000"')), 400),
    ("lone surrogate in a relayed message", "relays", _relay(_form_request('"\\ud83d"')), 400),
    ("NaN in relayed input requests", "relays", _relay('{"k": {"method": "x", "params": {"n": NaN}}}'), 400),
    (
        "relayed input requests nested deep",
        "relays",
        _relay('{"k": {"method": "x", "params": ' + DEEP + "}}"),
        400,
    ),
    ("nul in answer content", "respond", '{"action": "accept", "content": {"note": "a\\u0000"}}', 400),
    (
        "lone surrogate in answer content",
        "respond",
        '{"action": "accept", "content": {"note": "\\ud800"}}',
        400,
    ),
    ("NaN in answer content", "respond", '{"action": "accept", "content": {"count": NaN}}', 400),
    ("Infinity in answer content", "respond", '{"action": "accept", "content": {"count": Infinity}}', 400),
    ("nul in a decline reason", "respond", '{"action": "decline", "reason": "no\\u0000"}', 400),
    ("lone surrogate in a decline reason", "respond", '{"action": "decline", "reason": "\\udc00"}', 400),
    ("answer content nested deep", "respond", '{"action": "accept", "content": ' + DEEP + "}", 400),
    ("a 10 MB answer", "respond", json.dumps({"action": "accept", "content": {"note": BIG}}), 413),
]


@pytest.fixture
def world() -> dict[str, Any]:
    deploy = factories.server("deploy")
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    deploy.default_team = release
    deploy.save()
    agent_row, agent_token = factories.agent("ci-bot", servers=[deploy])
    _, reviewer_token = tokens.personal_token_create(user=alice)
    call = factories.call(deploy, agent_row)
    rnd = factories.open_round(call, keys=())
    ir = InputRequest.objects.create(
        round=rnd, key="note", message="A note", requested_schema=NOTE_SCHEMA, team=release
    )
    return {"agent": Agent(agent_token), "reviewer": Reviewer(reviewer_token), "ir": ir, "alice": alice}


def _counts() -> dict[str, Any]:
    return {
        "calls": ToolCall.objects.count(),
        "rounds": Round.objects.count(),
        "requests": InputRequest.objects.count(),
        "pending": InputRequest.objects.pending().count(),
        "decisions": Decision.objects.count(),
        "audit": AuditEvent.objects.count(),
    }


@pytest.mark.parametrize(("name", "kind", "body", "status"), API_BODIES, ids=[row[0] for row in API_BODIES])
def test_the_api_answers_hostile_bodies_in_json_and_stores_nothing(
    world: dict[str, Any], name: str, kind: str, body: str | bytes, status: int
) -> None:
    before = _counts()
    if kind == "respond":
        response = world["reviewer"].post(f"/input-requests/{world['ir'].pk}/respond", body)
    else:
        response = world["agent"].post(f"/{kind}", body)
    assert response.status_code == status, response.content[:300]
    assert response["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == ("body_too_large" if status == 413 else "invalid_body")
    assert error["message"]
    assert _counts() == before


def test_the_api_says_where_the_bad_value_is(world: dict[str, Any]) -> None:
    response = world["agent"].post("/calls", _call('{"steps": [{"name": "a\\u0000"}]}'))
    error = response.json()["error"]
    assert "NUL" in error["message"]
    assert error["fields"] == {"arguments.steps[0].name": "a NUL character"}


def test_the_same_bodies_without_the_hostile_part_are_accepted(world: dict[str, Any]) -> None:
    """The table's bodies are refused for what is hostile in them, not for their shape."""
    assert world["agent"].post("/calls", _call('{"branch": "main", "replicas": 2.5}')).status_code == 202
    nested = '{"a":' * 20 + "1" + "}" * 20
    assert world["agent"].post("/calls", _call(nested, ', "idempotency_key": "k2"')).status_code == 202
    response = world["reviewer"].post(
        f"/input-requests/{world['ir'].pk}/respond", '{"action": "decline", "reason": "not now"}'
    )
    assert response.status_code == 200, response.content


# --- the dashboard --------------------------------------------------------------------------------------


DASHBOARD_FORMS: list[tuple[str, dict[str, str], int, str]] = [
    ("nul in a decline reason", {"action": "decline", "reason": "not\x00now"}, 400, "NUL"),
    ("nul in a text field", {"action": "accept", "f-note": "a\x00b"}, 422, "Remove the null character"),
    ("NaN in a number field", {"action": "accept", "f-count": "NaN"}, 422, "Enter a number"),
    ("Infinity in a number field", {"action": "accept", "f-count": "Infinity"}, 422, "Enter a number"),
    ("a 10 MB reason", {"action": "decline", "reason": BIG}, 413, "Too much to send"),
]


@pytest.mark.parametrize(
    ("name", "data", "status", "shown"), DASHBOARD_FORMS, ids=[row[0] for row in DASHBOARD_FORMS]
)
def test_the_dashboard_answers_hostile_posts_with_a_readable_page(
    client: Any, world: dict[str, Any], name: str, data: dict[str, str], status: int, shown: str
) -> None:
    client.force_login(world["alice"])
    before = _counts()
    response = client.post(f"/requests/{world['ir'].pk}/respond/", data)
    assert response.status_code == status
    assert response["content-type"].startswith("text/html")
    page = response.content.decode()
    assert shown in page
    assert "Traceback" not in page
    assert _counts() == before


@pytest.mark.parametrize("query", ["tool=a%00b", "server=%00", "tool=%ED%A0%80"])
def test_queue_filters_with_a_nul_show_the_queue(client: Any, world: dict[str, Any], query: str) -> None:
    client.force_login(world["alice"])
    response = client.get(f"/?{query}")
    assert response.status_code == 200
    assert response["content-type"].startswith("text/html")


def test_the_body_limit_is_the_documented_setting() -> None:
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == settings.ELICIT_MAX_BODY == 1024 * 1024
    assert settings.ELICIT_MAX_JSON_DEPTH == 32


# --- the strict parse itself (pure) ---------------------------------------------------------------------


def test_the_depth_limit_counts_objects_and_arrays() -> None:
    assert safejson.loads('{"a": [1]}', max_depth=2) == {"a": [1]}
    with pytest.raises(safejson.Unstorable, match="nesting deeper than 2"):
        safejson.loads('{"a": [[1]]}', max_depth=2)
    with pytest.raises(safejson.Unstorable, match="nesting"):
        safejson.loads("[" * 100_000 + "]" * 100_000, max_depth=32)  # past Python's own recursion limit


def test_valid_surrogate_pairs_and_ordinary_text_pass() -> None:
    assert safejson.loads('"\\ud83d\\ude00 \\u00e9"', max_depth=4) == "\U0001f600 é"
    assert safejson.problem({"k": ["ok", 1.5, None, True]}, max_depth=4) is None
