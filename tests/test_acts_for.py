"""Whom an agent may act for: the users and teams it lists, no one else, and no way to probe usernames."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from approvals.models import AgentClient, Membership, ToolCall
from tests import factories
from tests.hub import Agent

pytestmark = pytest.mark.django_db

REFUSAL = {
    "error": {
        "code": "on_behalf_of_not_allowed",
        "message": "This agent may not act for that person.",
        "fields": {"on_behalf_of": "not a person this agent may act for"},
    }
}
URL_REQUEST = {
    "method": "elicitation/create",
    "params": {
        "mode": "url",
        "message": "Re-authenticate your SSO session",
        "url": "https://sso.example.com/",
    },
}


@pytest.fixture
def people():
    """carol and dave on team "release"; erin on team "payments"; a deploy server."""
    carol, dave, erin = factories.user("carol"), factories.user("dave"), factories.user("erin")
    release = factories.team("release", (carol, Membership.Role.REVIEWER), (dave, Membership.Role.VIEWER))
    payments = factories.team("payments", (erin, Membership.Role.REVIEWER))
    server = factories.server("deploy", default_team=release)
    return {
        "carol": carol,
        "dave": dave,
        "erin": erin,
        "release": release,
        "payments": payments,
        "server": server,
    }


def agent(people, **acts_for) -> Agent:
    _, token = factories.agent("ci-bot", servers=[people["server"]], **acts_for)
    return Agent(token)


def submit(bot: Agent, on_behalf_of: str, kind: str = "calls"):
    body = {"server": "deploy", "tool": "connect_account", "arguments": {}, "on_behalf_of": on_behalf_of}
    if kind == "relays":
        body["input_requests"] = {"sign_in": URL_REQUEST}
    return bot.post(f"/{kind}", body)


@pytest.mark.parametrize("kind", ["calls", "relays"])
def test_an_agent_acts_for_no_one_by_default_and_cannot_probe_usernames(people, kind: str) -> None:
    bot = agent(people)
    existing = submit(bot, "erin", kind)  # a reviewer of another team
    missing = submit(bot, "no-such-user", kind)
    assert existing.status_code == missing.status_code == 403
    assert existing.json() == missing.json() == REFUSAL
    assert not ToolCall.objects.exists()


@pytest.mark.parametrize("kind", ["calls", "relays"])
def test_an_agent_acts_for_the_users_and_team_members_it_lists(people, kind: str) -> None:
    bot = agent(people, acts_for_users=[people["erin"]], acts_for_teams=[people["release"]])
    for username in ("erin", "carol", "dave"):
        assert submit(bot, username, kind).status_code in (201, 202), username
    assert ToolCall.objects.filter(on_behalf_of__username__in=["erin", "carol", "dave"]).count() == 3


def test_team_membership_is_read_at_submit(people) -> None:
    bot = agent(people, acts_for_teams=[people["payments"]])
    assert submit(bot, "carol").json() == REFUSAL
    Membership.objects.create(team=people["payments"], user=people["carol"])
    assert submit(bot, "carol").status_code == 202
    Membership.objects.filter(team=people["payments"], user=people["erin"]).delete()
    assert submit(bot, "erin").json() == REFUSAL


def test_an_inactive_user_cannot_be_acted_for(people) -> None:
    bot = agent(people, acts_for_users=[people["erin"]])
    people["erin"].is_active = False
    people["erin"].save()
    assert submit(bot, "erin").json() == REFUSAL


def test_create_agent_sets_whom_it_may_act_for(people) -> None:
    out = io.StringIO()
    call_command(
        "create_agent",
        "ci-bot",
        "--server",
        "deploy",
        "--acts-for",
        "erin",
        "--acts-for",
        "team:release",
        stdout=out,
    )
    created = AgentClient.objects.get(name="ci-bot")
    assert list(created.acts_for_users.all()) == [people["erin"]]
    assert list(created.acts_for_teams.all()) == [people["release"]]
    assert "it may act for: erin, team:release" in out.getvalue()


@pytest.mark.parametrize(("value", "message"), [("nobody", "no user named"), ("team:nope", "no team")])
def test_create_agent_refuses_unknown_people(people, value: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command(
            "create_agent", "ci-bot", "--server", "deploy", "--acts-for", value, stdout=io.StringIO()
        )
    assert not AgentClient.objects.exists()


def test_the_admin_edits_whom_an_agent_may_act_for(people, admin_client) -> None:
    created, _ = factories.agent("ci-bot", servers=[people["server"]])
    page = admin_client.get(f"/admin/approvals/agentclient/{created.pk}/change/")
    assert page.status_code == 200
    assert b'name="acts_for_users"' in page.content and b'name="acts_for_teams"' in page.content
