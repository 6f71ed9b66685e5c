"""The answer form as a reviewer's browser gets it: pages that must render whatever a server suggests, and
attributes the page's own script reads, which must not change with the reviewer's language."""

from __future__ import annotations

import re
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.utils import translation

from approvals.forms import answer_form
from approvals.models import InputRequest, Membership
from tests import factories


def form(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


@pytest.fixture
def reviewer(db, client) -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    client.force_login(alice)
    return SimpleNamespace(user=alice, team=release, server=factories.server(default_team=release))


def asking(reviewer: Any, requested: dict[str, Any]) -> InputRequest:
    rnd = factories.open_round(factories.call(reviewer.server), team_=reviewer.team)
    ir = rnd.input_requests.get()
    ir.requested_schema = requested
    ir.save(update_fields=["requested_schema"])
    return ir


@pytest.mark.parametrize(
    ("default", "zone"),
    [("0001-01-01T00:00:00Z", "America/New_York"), ("9999-12-31T23:59:00-05:00", "Asia/Tokyo")],
)
def test_a_date_time_default_at_the_calendars_edge_still_shows_the_request(
    client, reviewer, default: str, zone: str
) -> None:
    # It once raised OverflowError while being shown in the reviewer's zone: a 500 for every reviewer
    # west (or east) of the server, so nobody could even open the request to decline it.
    ir = asking(reviewer, form({"when": {"type": "string", "format": "date-time", "default": default}}))
    client.cookies["tz"] = zone

    response = client.get(f"/requests/{ir.pk}/")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="f-when"' in html
    assert f'value="{default[:16]}"' in html


def _data_attributes(html: str, name: str) -> list[str]:
    return re.findall(rf'data-{name}="([^"]*)"', html)


@pytest.mark.parametrize("language", ["en", "de", "fa"])
def test_number_limits_reach_the_page_script_as_json_numbers_in_every_language(language: str) -> None:
    # The page's own checks read data-minimum / data-maximum with Number(): German's "1,5" is NaN there,
    # which silently turned the range check off (and a hint would disagree with the check).
    requested = form({"dose": {"type": "number", "minimum": 1.5, "maximum": 2.25}, "n": {"type": "integer"}})
    with translation.override(language):
        html = render_to_string(
            "approvals/_answer_form.html",
            {
                "form": answer_form(requested, tz="UTC"),
                "ir": SimpleNamespace(pk=uuid.uuid4()),
                "pending": True,
                "may_answer": True,
            },
        )

    assert _data_attributes(html, "minimum") == ["1.5"]
    assert _data_attributes(html, "maximum") == ["2.25"]


def test_a_confirmation_password_is_blanked_in_the_audit_log(client, reviewer) -> None:
    from approvals.audit import core as audit
    from approvals.models import AuditEvent

    requested = form(
        {"user": {"type": "string"}, "password2": {"type": "string"}, "smtp_pass": {"type": "string"}}
    )
    ir = asking(reviewer, requested)

    response = client.post(
        f"/requests/{ir.pk}/respond/",
        {"action": "accept", "f-user": "bob", "f-password2": "hunter2", "f-smtp_pass": "s3cret"},
    )

    assert response.status_code == 302
    event = AuditEvent.objects.get(verb="input.answered")
    assert event.data["content"] == {"user": "bob", "password2": audit.REDACTED, "smtp_pass": audit.REDACTED}
