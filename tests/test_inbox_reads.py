"""What one inbox answer reads, on PostgreSQL: the reviewer's teams once (for the queues' version and for
the page alike), then the page."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.services import tokens
from tests import factories

pytestmark = pytest.mark.django_db


def test_an_inbox_answer_reads_the_reviewers_teams_once() -> None:
    rita = factories.user("rita")
    release = factories.team("release", (rita, "reviewer"))
    ops = factories.team("ops")
    server = factories.server("deploy", default_team=release)
    factories.open_round(factories.call(server), team_=release)
    factories.open_round(factories.call(server, tool="rollback"), keys=("reason",), team_=ops)
    _, token = tokens.personal_token_create(user=rita)
    with CaptureQueriesContext(connection) as queries:
        response = Client().get("/api/v1/inbox", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert [item["key"] for item in response.json()] == ["environment"]  # ops' request is not hers
    teams = [q["sql"] for q in queries if 'FROM "approvals_team"' in q["sql"]]
    assert len(teams) == 1, teams
