"""Who an API token lets in, and what it lets an agent learn of servers it was not given."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import InputRequest, Membership, ToolCall
from approvals.services import tokens
from tests import factories
from tests.hub import Agent, ApiClient, off_the_loop

pytestmark = pytest.mark.django_db


def _refusal(response: Any, slug: str) -> tuple[int, str, str]:
    """The status, code and message of a refusal, with the slug it names taken out."""
    assert response["content-type"].startswith("application/json"), response.content
    error = response.json()["error"]
    assert error["message"], response.content
    return response.status_code, error["code"], error["message"].replace(slug, "<slug>")


def test_a_call_to_a_server_the_agent_was_not_given_reads_as_one_that_does_not_exist() -> None:
    """An agent learns no slug it was not given: a registered server it may not call is answered exactly as
    one that does not exist, as the gateway's ``/mcp/<slug>`` does (404 ``unknown_server``)."""
    factories.server("payments")
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    agent = Agent(token)
    body = {"tool": "refund", "arguments": {}}
    forbidden = agent.post("/calls", {**body, "server": "payments"})
    unknown = agent.post("/calls", {**body, "server": "pavments"})
    assert _refusal(forbidden, "payments") == _refusal(unknown, "pavments")
    assert forbidden.status_code == 404 and forbidden.json()["error"]["code"] == "unknown_server"
    assert not ToolCall.objects.exists()


def test_a_long_poll_let_in_by_its_session_is_judged_by_its_session_not_by_a_stray_token() -> None:
    """A signed-in browser's inbox long-poll that also carries an Authorization header the hub does not know
    (a stale token left in a script's defaults) was let in by its session: after the wait it is answered as
    the session still holds, not refused 401 as if a token it never used had been revoked meanwhile."""
    alice = factories.user("alice")
    factories.team("release", (alice, Membership.Role.REVIEWER))
    browser = Client(HTTP_AUTHORIZATION="Bearer ehp_not-a-token-of-this-hub")
    browser.force_login(alice)
    first = off_the_loop(browser.get, "/api/v1/inbox")
    assert first.status_code == 200, first.content
    waited = off_the_loop(browser.get, "/api/v1/inbox", {"version": first["Inbox-Version"], "wait": 1})
    assert waited.status_code == 200, waited.content
    assert waited.json() == []
    # Signed out, the stray header lets nothing in.
    browser.logout()
    assert off_the_loop(browser.get, "/api/v1/inbox").status_code == 401


def test_each_reviewer_s_token_reads_only_the_inbox_of_the_requests_they_may_answer() -> None:
    """A team's pending requests reach its reviewers and admins, the team it was escalated to, staff for the
    unrouted ones, and every superuser; never a viewer, another team, or anyone but the one person a request
    was made for."""
    vera, rita, adam, bob, stan, root, carol = (
        factories.user(name) for name in ("vera", "rita", "adam", "bob", "stan", "root", "carol")
    )
    stan.is_staff = True
    stan.save()
    root.is_superuser = True
    root.save()
    release = factories.team(
        "release",
        (vera, Membership.Role.VIEWER),
        (rita, Membership.Role.REVIEWER),
        (adam, Membership.Role.ADMIN),
    )
    billing = factories.team("billing", (bob, Membership.Role.REVIEWER), (carol, Membership.Role.REVIEWER))
    deploy = factories.server("deploy")
    factories.open_round(factories.call(deploy), keys=("release_only",), team_=release)
    factories.open_round(factories.call(deploy), keys=("billing_only",), team_=billing)
    factories.open_round(factories.call(deploy), keys=("unrouted",))
    escalated = factories.open_round(factories.call(deploy), keys=("escalated",), team_=release)
    InputRequest.objects.filter(round=escalated).update(escalation_team=billing)
    mine = factories.open_round(factories.call(deploy), keys=("for_carol",), team_=billing)
    InputRequest.objects.filter(round=mine).update(assignee=carol)
    expected = {
        "vera": set(),
        "rita": {"release_only", "escalated"},
        "adam": {"release_only", "escalated"},
        "bob": {"billing_only", "escalated"},
        "carol": {"billing_only", "escalated", "for_carol"},
        "stan": {"unrouted"},
        "root": {"release_only", "billing_only", "unrouted", "escalated"},
    }
    for person in (vera, rita, adam, bob, carol, stan, root):
        _, token = tokens.personal_token_create(user=person)
        response = ApiClient(token).get("/inbox")
        assert response.status_code == 200, response.content
        assert {item["key"] for item in response.json()} == expected[person.username], person.username
