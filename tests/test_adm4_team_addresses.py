"""A team's notice addresses in the admin: each one an address notices can be sent to, or a field error that
says which is not; what is kept is what the notices are sent to."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import Team
from approvals.services import notifications

pytestmark = pytest.mark.django_db

MANAGEMENT = {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}


def team_form(emails: str) -> dict[str, str]:
    return {"slug": "ops", "name": "Ops", "notify_emails": emails, "chat_webhook_url": ""} | MANAGEMENT


@pytest.mark.parametrize(
    ("typed", "named"),
    [
        ("ops@example.com, oncall@example", "“oncall@example”"),
        ("Ops Team <ops@example.com>", "“Ops”"),
        ("ops@example.com\nops at example.com", "“at”"),
    ],
)
def test_an_address_notices_cannot_go_to_is_a_field_error_naming_it(
    admin_client: Client, typed: str, named: str
) -> None:
    page = admin_client.post("/admin/approvals/team/add/", team_form(typed))

    assert page.status_code == 200
    assert "Not an email address" in page.text
    assert named in page.text
    assert not Team.objects.exists()


def test_too_many_addresses_are_a_field_error(admin_client: Client) -> None:
    typed = "\n".join(f"person{n}@example.com" for n in range(2_000))

    page = admin_client.post("/admin/approvals/team/add/", team_form(typed))

    assert page.status_code == 200
    assert "At most" in page.text
    assert not Team.objects.exists()


def test_addresses_are_kept_one_a_line_as_notices_are_sent_to_them(admin_client: Client) -> None:
    typed = "ops@example.com; oncall@example.com,\r\n\tops@example.com  lead@example.org"

    page = admin_client.post("/admin/approvals/team/add/", team_form(typed))

    assert page.status_code == 302
    team = Team.objects.get()
    assert team.notify_emails == "ops@example.com\noncall@example.com\nlead@example.org"
    assert notifications._recipients(team) == ["ops@example.com", "oncall@example.com", "lead@example.org"]
