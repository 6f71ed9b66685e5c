"""The grants page's filters offer each team, agent and tool once, read as distinct values in the database:
the page's cost follows how many teams, agents and tools there are, not how many grants were ever made
(expired and revoked ones stay). On the real database."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Membership
from approvals.services import grants
from tests import factories

pytestmark = pytest.mark.django_db


def test_the_filter_choices_are_distinct_values_read_in_the_database() -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    for n in range(6):
        call = factories.call(deploy, agent, tool="wipe" if n % 2 else "push", arguments={"n": n})
        grants.create_from_approval(
            approver=alice, call=call, tool_digest="d" * 64, choice={"for": "8h", "arguments": "exact"}
        )
    client = Client()
    client.force_login(alice)
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/grants/?state=").content.decode()
    assert page.count('<option value="push"') == 1 and page.count('<option value="wipe"') == 1
    assert page.count('<option value="ci-bot"') == 1 and page.count('<option value="release"') == 1
    choices = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and "approvals_grant" in q["sql"] and " LIMIT " not in q["sql"]
    ]
    assert len(choices) == 3, choices
    assert all(sql.startswith("SELECT DISTINCT") for sql in choices), choices
