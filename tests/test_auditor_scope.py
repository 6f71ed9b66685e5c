"""What the audit page offers a reader beyond the events: its export links and the names it suggests."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.models import AuditEvent, Membership
from tests import factories

pytestmark = pytest.mark.django_db


def test_the_export_links_of_a_page_with_a_bad_cursor_keep_its_filters(client: Client) -> None:
    """A page refused for its cursor still offers the exports: they must export what the filters say, not
    the whole log."""
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    release, platform = factories.team("release"), factories.team("platform")
    deploy = factories.server("deploy", default_team=release)
    k8s = factories.server("k8s", default_team=platform)
    kept = audit.record(actor=Actor.system(), verb="call.cancelled", call=factories.call(k8s))
    audit.record(actor=Actor.system(), verb="call.cancelled", call=factories.call(deploy))
    page = client.get(reverse("audit:index"), {"team": "platform", "before": "-3"})
    assert page.status_code == 400
    links = re.findall(r'href="([^"]*export\.csv[^"]*)"', page.content.decode())
    assert links
    for link in links:
        export = client.get(html.unescape(link))
        assert export.status_code == 200
        rows = b"".join(export.streaming_content).decode().splitlines()[1:]
        assert [row.split(",")[0] for row in rows] == [str(kept.id)]
    assert AuditEvent.objects.get(verb="audit.exported").data["filters"] == {"team": "platform"}


def test_the_server_names_suggested_are_those_of_the_readers_teams(client: Client) -> None:
    """The page suggests server names for its filter: a member of one team must not learn the names of
    the servers of teams they are not in."""
    release, hr = factories.team("release"), factories.team("hr")
    factories.server("deploy", default_team=release)
    factories.server("payroll-secret-merger", default_team=hr)
    member = factories.user("vera")
    Membership.objects.create(team=release, user=member, role=Membership.Role.VIEWER)
    client.force_login(member)
    body = client.get(reverse("audit:index")).content.decode()
    servers = re.search(r'<datalist id="audit-servers">(.*?)</datalist>', body, re.S)
    assert servers is not None
    assert re.findall(r'<option value="([^"]*)">', servers.group(1)) == ["deploy"]
    assert "payroll-secret-merger" not in body


def test_staff_are_also_offered_the_servers_of_no_team_and_superusers_every_server(client: Client) -> None:
    release = factories.team("release")
    factories.server("deploy", default_team=release)
    factories.server("shared")
    factories.server("payroll", default_team=factories.team("hr"))

    def offered(user: object) -> list[str]:
        client.force_login(user)
        body = client.get(reverse("audit:index")).content.decode()
        servers = re.search(r'<datalist id="audit-servers">(.*?)</datalist>', body, re.S)
        assert servers is not None
        return re.findall(r'<option value="([^"]*)">', servers.group(1))

    staff = factories.user("sam", is_staff=True)
    Membership.objects.create(team=release, user=staff, role=Membership.Role.VIEWER)
    assert offered(staff) == ["deploy", "shared"]
    assert offered(factories.user("root", is_superuser=True, is_staff=True)) == [
        "deploy",
        "payroll",
        "shared",
    ]
