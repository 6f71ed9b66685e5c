"""A call's timeline comes a page at a time: a call of many rounds of many requests, each shown with its
schema and the server's answer, is never read and shown whole."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit import queries as audit_queries
from approvals.audit.core import Actor
from tests import factories

pytestmark = pytest.mark.django_db

ENTRY = re.compile(r'<li id="event-(\d+)"')
LATER = re.compile(r'href="([^"]+)" rel="next" data-later')


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


def test_a_long_timeline_is_read_a_page_at_a_time(root: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_queries, "TIMELINE_PAGE", 3)
    call = factories.call(factories.server("busy"))
    ids = [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", call=call, data={"n": n}).id
        for n in range(7)
    ]
    pages, url = [], reverse("audit:call_timeline", args=[call.pk])
    while url:
        body = root.get(url).content.decode()
        pages.append([int(i) for i in ENTRY.findall(body)])
        later = LATER.search(body)
        url = later.group(1).replace("&amp;", "&") if later else ""
    assert pages == [ids[:3], ids[3:6], ids[6:]]


def test_an_events_timeline_link_opens_the_page_that_shows_it(root: Client, monkeypatch) -> None:
    monkeypatch.setattr(audit_queries, "TIMELINE_PAGE", 2)
    call = factories.call(factories.server("busy"))
    ids = [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", call=call, data={"n": n}).id
        for n in range(5)
    ]
    row = root.get(reverse("audit:index"), {"q": f"#{ids[3]}"}).content.decode()
    link = re.search(r'href="([^"#]+)#event-(\d+)">Timeline', row)
    assert link is not None and int(link.group(2)) == ids[3]
    body = root.get(link.group(1).replace("&amp;", "&")).content.decode()
    assert f'<li id="event-{ids[3]}"' in body


@pytest.mark.parametrize("start", ["abc", "0", "-4", "1" * 30])
def test_a_bad_page_of_a_timeline_is_a_readable_400(root: Client, start: str) -> None:
    call = factories.call(factories.server("busy"))
    audit.record(actor=Actor.system(), verb="server.tools_refreshed", call=call, data={})
    response = root.get(reverse("audit:call_timeline", args=[call.pk]), {"start": start})
    assert response.status_code == 400
    assert b"timeline" in response.content
