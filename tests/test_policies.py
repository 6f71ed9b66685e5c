"""Teams, routing rules and approval policies, end to end on the real stack."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import tasks
from approvals.models import AuditEvent, InputRequest, Membership, Policy, Round, RoutingRule, Team
from approvals.services import tokens
from tests import demo_support, factories
from tests.hub import Agent, Hub, Reviewer, WebhookReceiver, set_up_hub
from tests.live import wait_until

pytestmark = pytest.mark.timeout(180)


def reviewer(username: str, team: Team, role: str = Membership.Role.REVIEWER) -> tuple[Reviewer, object]:
    user = factories.user(username)
    Membership.objects.create(team=team, user=user, role=role)
    user.last_login = timezone.now()
    user.save(update_fields=["last_login"])
    return Reviewer(tokens.personal_token_create(user=user)[1]), user


@pytest.fixture
def hub(worker, demo_server) -> Hub:
    demo_support.reset(demo_server.url)
    return set_up_hub(demo_server.url)


@pytest.fixture
def release_policy(hub: Hub) -> Policy:
    """Production deploys go to team "release": two distinct approvals, no self-approval."""
    policy = Policy.objects.create(name="two approvals", approvals_required=2, forbid_self_approval=True)
    RoutingRule.objects.create(
        position=10,
        name="production deploys",
        server=hub.server,
        tool_pattern="create_*",
        conditions=[{"argument": "environment", "op": "==", "value": "production"}],
        team=Team.objects.get(slug="release"),
        policy=policy,
    )
    return policy


def requester_agent(hub: Hub, username: str) -> tuple[Agent, object]:
    """An agent that acts for (and is owned by) a member of the release team."""
    person = factories.user(username)
    Membership.objects.create(team=Team.objects.get(slug="release"), user=person)
    _, token = tokens.agent_create(
        name=f"{username}-agent", servers=[hub.server], owner=person, acts_for_users=[person]
    )
    return Agent(token), person


def test_two_approvals_no_self_approval(hub: Hub, release_policy: Policy, demo_server) -> None:
    agent, carol = requester_agent(hub, "carol")
    carol_reviewer = Reviewer(tokens.personal_token_create(user=carol)[1])
    bob, _ = reviewer("bob", Team.objects.get(slug="release"))
    call_id = agent.call(
        "create_deployment", {"branch": "main", "environment": "production"}, on_behalf_of="carol"
    )
    item = hub.reviewer.wait_for_request(call_id, "confirm")
    ir = InputRequest.objects.get(pk=item["id"])
    assert ir.team.slug == "release" and ir.policy == release_policy and ir.approvals_required == 2
    assert ir.routing["matched"] == "production deploys"

    refused = carol_reviewer.respond(item["id"], "accept", {"confirm": True})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "self_approval"
    assert "on your behalf" in refused.json()["error"]["message"]

    first = hub.reviewer.respond(item["id"], "accept", {"confirm": True, "reason": "release 2.3"})
    assert first.status_code == 200
    assert first.json()["status"] == "pending"
    listed = next(i for i in bob.inbox() if i["id"] == item["id"])
    assert listed["approvals"]["required"] == 2
    assert [a["user"] for a in listed["approvals"]["given"]] == ["alice"]
    assert listed["approvals"]["given"][0]["content"] == {"confirm": True, "reason": "release 2.3"}
    again = hub.reviewer.respond(item["id"], "accept", {"confirm": True, "reason": "release 2.3"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_approved"

    second = bob.respond(item["id"], "accept", {"confirm": True, "reason": "release 2.3"})
    assert second.status_code == 200 and second.json()["status"] == "answered"
    body = agent.wait(call_id)
    assert body["status"] == "completed" and body["result"]["isError"] is False
    retries = [
        r["body"]["params"]["inputResponses"]
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    assert retries == [
        {"confirm": {"action": "accept", "content": {"confirm": True, "reason": "release 2.3"}}}
    ]
    assert demo_support.executions(demo_server.url)["create_deployment"] == 1
    verbs = set(AuditEvent.objects.filter(call_id=call_id).values_list("verb", flat=True))
    assert {"input.routed", "input.refused", "input.approved", "input.answered"} <= verbs


def test_changed_values_restart_the_count(hub: Hub, release_policy: Policy) -> None:
    bob, _ = reviewer("bob", Team.objects.get(slug="release"))
    dan, _ = reviewer("dan", Team.objects.get(slug="release"))
    call_id = hub.agent.call("create_deployment", {"branch": "main", "environment": "production"})
    item = hub.reviewer.wait_for_request(call_id, "confirm")
    hub.reviewer.respond(item["id"], "accept", {"confirm": True, "reason": "a"})
    assert bob.respond(item["id"], "accept", {"confirm": True, "reason": "b"}).json()["status"] == "pending"
    assert AuditEvent.objects.filter(call_id=call_id, verb="input.approvals_restarted").exists()
    assert dan.respond(item["id"], "accept", {"confirm": True, "reason": "b"}).json()["status"] == "answered"
    assert InputRequest.objects.get(pk=item["id"]).content == {"confirm": True, "reason": "b"}


def test_a_decline_by_any_eligible_reviewer_ends_it_at_once(hub: Hub, release_policy: Policy) -> None:
    call_id = hub.agent.call("create_deployment", {"branch": "main", "environment": "production"})
    item = hub.reviewer.wait_for_request(call_id, "confirm")
    response = hub.reviewer.respond(item["id"], "decline", reason="change freeze")
    assert response.status_code == 200 and response.json()["status"] == "answered"
    body = hub.agent.wait(call_id)
    assert body["status"] == "completed" and body["result"]["isError"] is True


def test_someone_outside_the_team_is_refused_and_does_not_see_it(hub: Hub, release_policy: Policy) -> None:
    ops = Team.objects.create(slug="ops", name="Ops")
    outsider, _ = reviewer("erin", ops)
    call_id = hub.agent.call("create_deployment", {"branch": "main", "environment": "production"})
    item = hub.reviewer.wait_for_request(call_id, "confirm")
    assert outsider.inbox() == []
    response = outsider.respond(item["id"], "accept", {"confirm": True})
    assert response.status_code == 403 and response.json()["error"]["code"] == "not_a_reviewer"
    assert AuditEvent.objects.filter(call_id=call_id, verb="input.refused", actor_label="erin").exists()


def test_removing_a_member_takes_their_access_at_once(hub: Hub, release_policy: Policy) -> None:
    bob, bob_user = reviewer("bob", Team.objects.get(slug="release"))
    call_id = hub.agent.call("create_deployment", {"branch": "main", "environment": "production"})
    item = bob.wait_for_request(call_id, "confirm")
    Membership.objects.filter(user=bob_user).delete()
    assert bob.inbox() == []
    assert bob.respond(item["id"], "accept", {"confirm": True}).status_code == 403


def test_escalation_reaches_the_fallback_team_after_its_delay(hub: Hub, demo_server) -> None:
    ops = Team.objects.create(slug="ops", name="Ops")
    frank, _ = reviewer("frank", ops)
    with WebhookReceiver() as chat:
        ops.chat_webhook_url = chat.url
        ops.save()
        policy = Policy.objects.create(name="escalating", escalate_after=300, escalation_team=ops)
        RoutingRule.objects.create(
            position=1,
            name="all deploys",
            tool_pattern="create_deployment",
            team=Team.objects.get(slug="release"),
            policy=policy,
        )
        call_id = hub.agent.call("create_deployment", {"branch": "main"})
        item = hub.reviewer.wait_for_request(call_id, "environment")
        assert frank.inbox() == []
        assert tasks.escalate_and_warn() == 0  # not yet: five minutes have not passed
        # Time travel: the request was created six minutes ago.
        InputRequest.objects.filter(pk=item["id"]).update(created_at=timezone.now() - timedelta(minutes=6))
        assert tasks.escalate_and_warn() == 1
        assert [i["id"] for i in frank.inbox()] == [item["id"]]
        event = AuditEvent.objects.get(call_id=call_id, verb="input.escalated")
        assert event.data["to"] == "ops" and event.data["from"] == "release"
        notice = wait_until(
            lambda: next((r for r in chat.received if "escalated" in r.json()["text"]), None), 30
        )
        assert "create_deployment" in notice.json()["text"]
        assert frank.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200
        assert hub.agent.wait(call_id)["status"] == "completed"


@pytest.mark.parametrize("on_expiry", ["cancel", "abandon"])
def test_expiry_follows_the_policy_and_tells_the_agent(hub: Hub, demo_server, on_expiry: str) -> None:
    policy = Policy.objects.create(name=f"expire-{on_expiry}", ttl=120, on_expiry=on_expiry)
    RoutingRule.objects.create(
        position=1, name="short clock", tool_pattern="*", team=Team.objects.get(slug="release"), policy=policy
    )
    with WebhookReceiver() as hook:
        call_id = hub.agent.call("create_deployment", {"branch": "main"}, callback_url=hook.url)
        hub.reviewer.wait_for_request(call_id, "environment")
        rnd = Round.objects.get(call_id=call_id)
        assert (rnd.deadline - rnd.opened_at).total_seconds() == pytest.approx(120, abs=1)
        Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() - timedelta(seconds=1))
        assert tasks.expire_stale() == 1
        body = hub.agent.wait(call_id)
        assert body["status"] == "expired"
        hook.wait_for("call.expired")
    sent = [
        r
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]
    if on_expiry == "cancel":
        assert [r["body"]["params"]["inputResponses"] for r in sent] == [
            {"environment": {"action": "cancel"}}
        ]
    else:
        assert sent == [] and body["error"]["code"] == "expired"


def test_url_mode_goes_to_the_person_the_agent_acts_for(hub: Hub) -> None:
    agent, carol = requester_agent(hub, "carol")
    carol_reviewer = Reviewer(tokens.personal_token_create(user=carol)[1])
    call_id = agent.call("connect_account", {"service": "github"}, on_behalf_of="carol")
    item = carol_reviewer.wait_for_request(call_id, "sign_in")
    assert item["mode"] == "url"
    assert hub.reviewer.inbox() == []  # alice is in the team, but the link was made for carol
    refused = hub.reviewer.respond(item["id"], "accept")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_the_assignee"
    assert carol_reviewer.respond(item["id"], "accept").status_code == 200
    assert agent.wait(call_id)["status"] == "completed"


def test_a_high_risk_policy_wants_a_recent_sign_in(hub: Hub) -> None:
    policy = Policy.objects.create(name="high risk", risk="high", reauth_within=600)
    RoutingRule.objects.create(
        position=1, name="risky", tool_pattern="*", team=Team.objects.get(slug="release"), policy=policy
    )
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    item = hub.reviewer.wait_for_request(call_id, "environment")
    alice = hub.reviewer_user
    alice.last_login = timezone.now() - timedelta(hours=2)
    alice.save(update_fields=["last_login"])
    response = hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "reauth_required"
    alice.last_login = timezone.now()
    alice.save(update_fields=["last_login"])
    assert hub.reviewer.respond(item["id"], "accept", {"environment": "staging"}).status_code == 200


def test_the_call_page_explains_which_rule_matched_and_why(hub: Hub, release_policy: Policy) -> None:
    from django.test import Client

    call_id = hub.agent.call("create_deployment", {"branch": "main", "environment": "production"})
    hub.reviewer.wait_for_request(call_id, "confirm")
    browser = Client()
    browser.force_login(hub.reviewer_user)
    page = browser.get(f"/calls/{call_id}/routing/").content.decode()
    assert "production deploys" in page and "two approvals" in page
    assert "environment is &#x27;production&#x27;" in page
    outsider = Client()
    outsider.force_login(factories.user("zed"))
    assert outsider.get(f"/calls/{call_id}/routing/").status_code == 404
