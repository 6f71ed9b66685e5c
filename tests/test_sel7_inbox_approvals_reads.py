"""An inbox page of requests that need several approvals reads who approved so far in one statement for the
whole page, not one per item (a page of two hundred such requests was two hundred more statements)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Decision, InputRequest, Policy
from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db


def _inbox(token: str) -> tuple[list[dict[str, Any]], int]:
    with CaptureQueriesContext(connection) as queries:
        response = Client().get("/api/v1/inbox", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    return response.json(), len(queries)


def _waiting(server: Any, team: Any, policy: Policy, approver: Any, count: int) -> None:
    for n in range(count):
        ir = factories.open_round(factories.call(server, tool=f"tool_{n}"), team_=team).input_requests.get()
        InputRequest.objects.filter(pk=ir.pk).update(policy=policy, approvals_required=2)
        Decision.objects.create(
            input_request=ir, user=approver, action="accept", content={"environment": "eu"}
        )
        # An approval whose values a later reviewer changed does not count.
        Decision.objects.create(input_request=ir, user=approver, action="accept", content={}, superseded=True)


def test_who_approved_is_read_once_per_page() -> None:
    rita, bob = factories.user("rita"), factories.user("bob")
    release = factories.team("release", (rita, "reviewer"), (bob, "reviewer"))
    server = factories.server("deploy", default_team=release)
    two = Policy.objects.create(name="two", approvals_required=2)
    _, token = tokens.personal_token_create(user=rita)
    _waiting(server, release, two, bob, 2)
    _inbox(token)  # the token's first use, and the statements' first compilation, aside
    few, reads_few = _inbox(token)
    _waiting(server, release, two, bob, 10)
    many, reads_many = _inbox(token)

    assert len(few) == 2 and len(many) == 12
    assert reads_many == reads_few
    for item in many:
        assert item["approvals"]["required"] == 2
        assert [(given["user"], given["content"]) for given in item["approvals"]["given"]] == [
            ("bob", {"environment": "eu"})
        ]
