"""The rule list's editable columns (position, enabled): saving the list changes only the rows the admin
changed on it. A row someone else switched since the list was shown is not put back as the page showed it,
unseen, and recorded as this admin's change."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.test import Client

from approvals.models import AuditEvent, RoutingRule
from tests import factories

pytestmark = pytest.mark.django_db

LIST = "/admin/approvals/routingrule/"


class _Inputs(HTMLParser):
    """What a browser posts for the page's changelist form, as it was drawn."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.data: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        if tag == "form" and found.get("id") == "changelist-form":
            self.inside = True
        if not self.inside or tag != "input" or not found.get("name"):
            return
        if found.get("type") == "checkbox" and "checked" not in found:
            return
        if found.get("type") == "submit" and found["name"] != "_save":
            return
        self.data[found["name"]] = found.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False


def posted_as_shown(page: str) -> dict[str, str]:
    parser = _Inputs()
    parser.feed(page)
    return parser.data


def row_of(data: dict[str, str], rule: RoutingRule) -> str:
    return next(
        name[: -len("-id")] for name, value in data.items() if name.endswith("-id") and value == str(rule.pk)
    )


def test_a_row_switched_by_someone_else_since_the_list_was_shown_is_not_put_back(
    admin_client: Client,
) -> None:
    team, server = factories.team("release"), factories.server()
    gate = RoutingRule.objects.create(name="gate deploys", server=server, team=team, gate=True, enabled=False)
    other = RoutingRule.objects.create(name="ask for notes", server=server, team=team, position=200)
    shown = posted_as_shown(admin_client.get(LIST).text)
    # Meanwhile another admin switches the gate on.
    RoutingRule.objects.filter(pk=gate.pk).update(enabled=True)
    events = AuditEvent.objects.count()

    data = shown | {f"{row_of(shown, other)}-position": "50"}  # this admin moves the other rule only
    page = admin_client.post(LIST, data)

    assert page.status_code == 302, page.text
    gate.refresh_from_db()
    other.refresh_from_db()
    assert gate.enabled is True
    assert other.position == 50
    changed = AuditEvent.objects.filter(pk__gt=0).order_by("pk")[events:]
    said = [event.data["message"] for event in changed if event.verb.startswith("rule.")]
    assert len(said) == 1
    assert "ask for notes" in said[0]


def test_a_row_the_admin_switched_is_saved(admin_client: Client) -> None:
    team, server = factories.team("release"), factories.server()
    gate = RoutingRule.objects.create(name="gate deploys", server=server, team=team, gate=True, enabled=False)
    shown = posted_as_shown(admin_client.get(LIST).text)

    page = admin_client.post(LIST, shown | {f"{row_of(shown, gate)}-enabled": "on"})

    assert page.status_code == 302, page.text
    gate.refresh_from_db()
    assert gate.enabled is True
