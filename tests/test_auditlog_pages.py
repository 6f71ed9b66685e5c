"""The audit table's rows as readers see them, and what reading them costs."""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit.core import Actor
from tests import factories
from tests.hub import Agent

pytestmark = pytest.mark.django_db

# The data column read whole, not one of its keys (``"data" -> 'message'``).
WHOLE_DATA = re.compile(r'"approvals_auditevent"\."data"(?!\s*(->|#>))')
DATA_READ = re.compile(r'"approvals_auditevent"\."data"')


def summary_cells(body: str) -> list[str]:
    return [
        html.unescape(cell) for cell in re.findall(r'<td class="summary" dir="auto">(.*?)</td>', body, re.S)
    ]


def test_the_audit_table_and_its_poll_never_read_the_events_whole_data(client: Client) -> None:
    """A call's arguments may be a megabyte: a page of fifty such events read whole was tens of megabytes
    fetched and decoded to show one line of each."""
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    call = factories.call(factories.server("deploy"))
    bulky = {"tool": "t", "arguments": {"blob": "x" * 200_000}, "channel": "api"}
    first = audit.record(actor=Actor.system(), verb="call.submitted", call=call, data=bulky)
    audit.record(actor=Actor.system(), verb="call.submitted", call=call, data=bulky)
    with CaptureQueriesContext(connection) as page_queries:
        page = client.get(reverse("audit:index"))
        found = client.get(reverse("audit:index"), {"q": "api"})  # a text search reads in windows
    with CaptureQueriesContext(connection) as poll_queries:
        poll = client.get(reverse("audit:newer"), {"after": first.id - 1})
    assert page.status_code == found.status_code == poll.status_code == 200
    assert len(re.findall(r"data-event-id=", page.content.decode())) == 2
    assert len(re.findall(r"data-event-id=", found.content.decode())) == 2
    assert poll["X-Audit-Count"] == "2"
    for query in [*page_queries.captured_queries, *poll_queries.captured_queries]:
        sql = query["sql"]
        if "approvals_auditevent" in sql:
            assert not WHOLE_DATA.search(sql), sql
            # What a row shows is read for the page's events by id, never while the matches are sorted.
            assert not DATA_READ.search(sql) or '"approvals_auditevent"."id" IN (' in sql, sql


def test_each_row_shows_the_first_of_message_reason_problem_and_error_message(client: Client) -> None:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    call = factories.call(factories.server("deploy"))
    for data in (
        {"message": "Deploy <b>v2</b>?", "reason": "not shown"},
        {"message": "", "reason": "Too risky"},
        {"problem": "url mode is not allowed"},
        {"error": {"code": -32000, "message": "tool crashed"}},
        {"error": "a text, not an object"},
        {"other": "nothing to show"},
    ):
        audit.record(actor=Actor.system(), verb="call.failed", call=call, data=data)
    body = client.get(reverse("audit:index")).content.decode()
    assert summary_cells(body)[::-1] == [
        "Deploy <b>v2</b>?",
        "Too risky",
        "url mode is not allowed",
        "tool crashed",
        "",
        "",
    ]
    assert "<b>v2</b>" not in body  # escaped, as every server text


def test_a_long_summary_is_folded_and_a_huge_one_cut_with_an_ellipsis(client: Client) -> None:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    call = factories.call(factories.server("deploy"))
    audit.record(actor=Actor.system(), verb="call.failed", call=call, data={"reason": "r" * 300})
    audit.record(
        actor=Actor.system(), verb="call.failed", call=call, data={"error": {"message": "e" * 50_000}}
    )
    huge, long = summary_cells(client.get(reverse("audit:index")).content.decode())
    assert long == f"<details><summary>{'r' * 199}…</summary>{'r' * 300}</details>"
    assert huge == f"<details><summary>{'e' * 199}…</summary>{'e' * 9_999}…</details>"


def test_a_relays_server_label_is_shown_with_its_invisible_characters_revealed(client: Client) -> None:
    """A relay's server label is the agent's own text: with a zero-width space it read, in the audit table,
    as text without one. (One that reads as a registered server the agent may not use is refused outright.)"""
    factories.server("payroll")
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    ask = {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "OK?", "requestedSchema": {"type": "object", "properties": {}}},
    }
    posing = Agent(token).post(
        "/relays", {"server": "payroll\u200b", "tool": "t", "input_requests": {"a": ask}}
    )
    assert posing.status_code == 403 and posing.json()["error"]["code"] == "server_not_allowed"
    relay = Agent(token).post(
        "/relays", {"server": "ledger\u200b", "tool": "t", "input_requests": {"a": ask}}
    )
    assert relay.status_code == 201, relay.content
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    body = client.get(reverse("audit:index")).content.decode()
    assert "ledger\u200b" not in body
    assert re.search(r"<bdi>ledger<span class=\"ctl\"[^>]*>U\+200B</span></bdi>", body)
