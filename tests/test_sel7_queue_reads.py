"""The queue page, its list and its count read a fixed number of statements whatever the backlog; and
nothing of another team's rounds reaches them: not a card, a filter choice or a count."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import McpServer, Policy
from tests import factories

pytestmark = pytest.mark.django_db

PAGES = ("/", "/queue/list/", "/queue/count/", "/?risk=high&mode=form&tool=tool_0", "/?server=deploy")


def _backlog(rounds: int) -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, "reviewer"))
    secret = factories.team("secret")
    server = factories.server("deploy", default_team=release)
    hidden = factories.server("vault", name="Vault")
    agent, _ = factories.agent("ci-bot", servers=[server, hidden])
    risky = Policy.objects.create(name="risky", risk="high")
    for n in range(rounds):
        rnd = factories.open_round(
            factories.call(server, agent, tool=f"tool_{n}"), team_=release, keys=("a", "b")
        )
        rnd.input_requests.update(policy=risky)
        factories.open_round(factories.call(hidden, agent, tool=f"rotate_{n}"), team_=secret)
    return alice


def _reads(client: Any) -> dict[str, int]:
    counts = {}
    for page in PAGES:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(page)
        assert response.status_code == 200
        assert "rotate_" not in response.text and "vault" not in response.text.lower()
        counts[page] = len(queries)
    return counts


def test_the_queue_reads_the_same_statements_for_one_round_as_for_many(
    client: Any, django_assert_max_num_queries: Any
) -> None:
    alice = _backlog(1)
    client.force_login(alice)
    client.get("/")  # the session's first read of the user aside
    few = _reads(client)

    for n in range(1, 15):
        server = McpServer.objects.get(slug="deploy")
        rnd = factories.open_round(factories.call(server, tool=f"more_{n}"), team_=alice.teams.get())
        rnd.input_requests.update(policy=Policy.objects.get())
    many = _reads(client)
    assert many == few
    with django_assert_max_num_queries(14):
        assert client.get("/").status_code == 200


def test_counts_and_choices_hold_only_the_reviewers_rounds(client: Any) -> None:
    alice = _backlog(3)
    client.force_login(alice)
    assert client.get("/queue/count/").json() == {"pending": 6}
    assert client.get("/queue/count/", {"server": "vault"}).json() == {"pending": 0}
    assert client.get("/queue/count/", {"tool": "rotate_0"}).json() == {"pending": 0}
    page = client.get("/", {"server": "vault"}).text
    assert "data-round=" not in page
