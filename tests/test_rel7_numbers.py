"""A number JSON cannot carry (NaN, Infinity) or the hub cannot hold (1e400) is named where it is."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import AuditEvent, ToolCall
from tests import factories
from tests.hub import off_the_loop

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> Client:
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client: Client, path: str, body: str) -> Any:
    return off_the_loop(client.post, f"/api/v1{path}", body, content_type="application/json")


@pytest.mark.parametrize(
    ("number", "message"),
    [
        ("NaN", "The request body holds NaN at $.arguments.steps[1].n, which is not a JSON number."),
        (
            "-Infinity",
            "The request body holds -Infinity at $.arguments.steps[1].n, which is not a JSON number.",
        ),
        ("1e400", "The request body holds 1e400 at $.arguments.steps[1].n, a number too large to store."),
        ("-1E+999", "The request body holds -1E+999 at $.arguments.steps[1].n, a number too large to store."),
    ],
)
def test_a_number_that_cannot_be_stored_is_named_where_it_is(
    client: Client, number: str, message: str
) -> None:
    """docs/api.md, "Bodies": the message says what and where, and `fields` names the place. NaN and Infinity
    were refused as the parser met them, before any place was known: `fields` said `body`, and the message
    read "holds NaN is not a JSON number at $."; 1e400 was said to be "inf"."""
    body = '{"server": "deploy", "tool": "t", "arguments": {"steps": [{"n": 1}, {"n": NUMBER}]}}'
    body = body.replace("NUMBER", number)
    response = post(client, "/calls", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_body"
    assert error["message"] == message
    assert error["fields"] == {"arguments.steps[1].n": f"{number} is not a JSON number"}
    assert not ToolCall.objects.exists()
    assert not AuditEvent.objects.filter(verb="call.submitted").exists()


def test_a_long_number_too_large_is_refused_and_named_short(client: Client) -> None:
    """A number of 400 digits before its point is as infinite as 1e400: refused, shown by its start."""
    number = "9" * 400 + ".5"
    body = '{"server": "deploy", "tool": "t", "input_requests": {"k": {"method": "m", "params": {"x": N}}}}'
    response = post(client, "/relays", body.replace("N}", number + "}"))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["fields"] == {"input_requests.k.params.x": "9" * 40 + "... is not a JSON number"}
    assert not ToolCall.objects.exists()


def test_numbers_a_double_holds_still_pass(client: Client) -> None:
    body = '{"server": "deploy", "tool": "t", "arguments": {"a": 1e308, "b": -0.0, "c": 5e-324, "d": 1.5}}'
    response = post(client, "/calls", body)
    assert response.status_code == 202, response.content
    assert ToolCall.objects.get().arguments["d"] == 1.5
