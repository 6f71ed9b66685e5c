"""API bodies are JSON objects in UTF-8 (docs/api.md, "Bodies"): anything else is a clear 400 that stores
nothing, whatever encoding Python's own json module would have guessed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from approvals.models import AuditEvent, ToolCall
from tests import factories

pytestmark = pytest.mark.django_db

CALL = {"server": "deploy", "tool": "create_deployment", "arguments": {"branch": "main"}}


@pytest.fixture
def client() -> Client:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)


def _post(client: Client, body: bytes) -> Any:
    return client.post("/api/v1/calls", body, content_type="application/json")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_a_body_in_another_encoding_than_utf8_is_refused(client: Client, encoding: str) -> None:
    """json.loads(bytes) guesses UTF-16 and UTF-32 from the first bytes: the hub must not, since a proxy or
    filter in front of it reads the body as the UTF-8 the contract names (and sees something else)."""
    events = AuditEvent.objects.count()
    response = _post(client, json.dumps(CALL).encode(encoding))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_body"
    assert "UTF-8" in error["message"]
    assert not ToolCall.objects.exists() and AuditEvent.objects.count() == events


def test_a_utf8_body_with_a_byte_order_mark_is_still_read(client: Client) -> None:
    """RFC 8259 lets a parser ignore a UTF-8 byte order mark; some clients send one."""
    response = _post(client, b"\xef\xbb\xbf" + json.dumps(CALL).encode())
    assert response.status_code == 202, response.content
    assert ToolCall.objects.get().arguments == {"branch": "main"}


@pytest.mark.parametrize("body", [b"[]", b'[{"server": "deploy", "tool": "t"}]', b'"deploy"', b"null", b"5"])
def test_json_that_is_not_an_object_is_named_as_such(client: Client, body: bytes) -> None:
    """Not "server: Field required" for a body that holds the very fields inside an array."""
    response = _post(client, body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_body"
    assert error["message"] == "The request body must be a JSON object."
    assert error["fields"] == {"body": "must be a JSON object"}
    assert not ToolCall.objects.exists()


def test_an_answer_that_is_not_an_object_is_named_as_such() -> None:
    """The reviewers' endpoints parse the same way."""
    alice = factories.user("alice", is_superuser=True)
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    response = client.post(
        "/api/v1/input-requests/00000000-0000-0000-0000-000000000000/respond",
        b"[]",
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"body": "must be a JSON object"}


@pytest.mark.parametrize(
    "body",
    [
        b'{"server": "elsewhere", "server": "deploy", "tool": "create_deployment"}',
        b'{"server": "deploy", "tool": "t", "arguments": {"env": "staging", "env": "production"}}',
        b'{"server": "deploy", "tool": "t", "arguments": {"steps": [{"a": 1, "a": 1}]}}',
    ],
    ids=["top", "arguments", "nested"],
)
def test_a_key_given_twice_in_one_object_is_refused_not_half_dropped(client: Client, body: bytes) -> None:
    """Python keeps the last of two members with one name, silently: the first is lost, and anything in front
    of the hub that reads the first (many parsers do) sees another call than the one the hub would make."""
    response = _post(client, body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_body"
    assert "twice" in error["message"]
    assert not ToolCall.objects.exists()


def test_the_same_name_in_sibling_objects_is_fine(client: Client) -> None:
    body = b'{"server": "deploy", "tool": "t", "arguments": {"a": {"x": 1}, "b": {"x": 2}, "x": 3}}'
    response = _post(client, body)
    assert response.status_code == 202, response.content
    assert ToolCall.objects.get().arguments == {"a": {"x": 1}, "b": {"x": 2}, "x": 3}


def test_an_integer_too_long_to_read_is_named_not_called_invalid_json(client: Client) -> None:
    """JSON sets no limit on a number's digits; Python reads at most 4,300 of an integer. The body is valid
    JSON, so "not valid JSON" sent its author looking for a syntax error that is not there."""
    body = b'{"server": "deploy", "tool": "t", "arguments": {"n": ' + b"9" * 5000 + b"}}"
    response = _post(client, body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_body"
    assert "not valid JSON" not in error["message"] and "4300 digits" in error["message"]
    assert not ToolCall.objects.exists()
