"""A reviewer who ticks every option of a form's multi-selects posts thousands of values: the answer is
taken, not refused by Django's count of form fields (1,000 by default) with a 400 that loses the form."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import Membership
from approvals.schema_forms._common import MAX_CHOICES, MAX_PROPERTIES
from tests import factories

FIELDS = 8
OPTIONS = [f"o{i}" for i in range(MAX_CHOICES)]
SCHEMA = {
    "type": "object",
    "properties": {
        f"pick{n}": {"type": "array", "items": {"type": "string", "enum": OPTIONS}} for n in range(FIELDS)
    },
}


@pytest.mark.django_db
def test_every_option_of_every_multi_select_ticked_is_an_answer(client: Client) -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server(default_team=release)
    ir = factories.open_round(factories.call(server), team_=release).input_requests.get()
    ir.requested_schema = SCHEMA
    ir.save(update_fields=["requested_schema"])
    client.force_login(alice)
    posted: dict[str, Any] = {"action": "accept", "tz": "UTC"}
    posted.update({f"f-pick{n}": OPTIONS for n in range(FIELDS)})

    response = client.post(f"/requests/{ir.pk}/respond/", posted)

    assert response.status_code == 302, response.content.decode()[:500]
    ir.refresh_from_db()
    assert ir.content == {f"pick{n}": OPTIONS for n in range(FIELDS)}


def test_the_limit_holds_the_largest_form_the_hub_draws() -> None:
    from django.conf import settings

    assert settings.DATA_UPLOAD_MAX_NUMBER_FIELDS >= MAX_PROPERTIES * MAX_CHOICES + 3


@pytest.mark.django_db
def test_a_country_picker_is_a_form() -> None:
    from approvals import schema_forms

    countries = [f"C{i:03d}" for i in range(249)]
    schema = {
        "type": "object",
        "properties": {
            "country": {
                "type": "string",
                "oneOf": [{"const": code, "title": f"Country {code}"} for code in countries],
            },
            "visited": {"type": "array", "items": {"type": "string", "enum": countries}},
        },
    }
    assert schema_forms.check_schema(schema) == []
