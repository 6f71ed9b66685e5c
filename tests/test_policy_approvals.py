"""N-of-M approvals as a security team relies on them: only approvals by people who may still answer count,
every approval is of exactly the values sent, and a request only one person may answer needs only them."""

from __future__ import annotations

import pytest
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Membership, Policy, RoutingRule, Team
from approvals.services import answers, servers, tokens
from approvals.services.errors import Conflict
from tests import demo_support, factories
from tests.hub import Agent, Hub, Reviewer, set_up_hub

pytestmark = pytest.mark.timeout(180)


def reviewer(username: str, team: Team) -> tuple[Reviewer, object]:
    user = factories.user(username)
    Membership.objects.create(team=team, user=user, role=Membership.Role.REVIEWER)
    user.last_login = timezone.now()
    user.save(update_fields=["last_login"])
    return Reviewer(tokens.personal_token_create(user=user)[1]), user


@pytest.fixture
def hub(worker, demo_server) -> Hub:
    demo_support.reset(demo_server.url)
    return set_up_hub(demo_server.url)


def _two_approvals(hub: Hub, tool_pattern: str = "create_*") -> Policy:
    policy = Policy.objects.create(name="two approvals", approvals_required=2)
    RoutingRule.objects.create(
        position=10,
        name="two people",
        server=hub.server,
        tool_pattern=tool_pattern,
        team=Team.objects.get(slug="release"),
        policy=policy,
    )
    return policy


def _retries(demo_url: str) -> list[dict]:
    return [
        r["body"]["params"]["inputResponses"]
        for r in demo_support.recorded_requests(demo_url)
        if r["body"].get("method") == "tools/call" and r["body"]["params"].get("inputResponses")
    ]


def test_an_approval_by_someone_since_removed_from_the_team_no_longer_counts(hub: Hub, demo_server) -> None:
    release = Team.objects.get(slug="release")
    _two_approvals(hub)
    bob, bob_user = reviewer("bob", release)
    dan, _ = reviewer("dan", release)
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    item = bob.wait_for_request(call_id, "environment")

    assert bob.respond(item["id"], "accept", {"environment": "staging"}).json()["status"] == "pending"
    Membership.objects.filter(user=bob_user).delete()  # bob leaves the team (or loses the right) meanwhile

    # Alice's is now the only approval of someone who may answer: one of two, nothing is sent.
    second = hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    assert second.status_code == 200 and second.json()["status"] == "pending"
    assert InputRequest.objects.get(pk=item["id"]).status == InputRequest.Status.PENDING
    dropped = AuditEvent.objects.get(call_id=call_id, verb="input.approvals_restarted")
    assert dropped.data["no_longer_allowed"] == ["bob"] and dropped.data["superseded"] == 1

    third = dan.respond(item["id"], "accept", {"environment": "staging"})
    assert third.status_code == 200 and third.json()["status"] == "answered"
    assert hub.agent.wait(call_id)["status"] == "completed"
    assert _retries(demo_server.url) == [
        {"environment": {"action": "accept", "content": {"environment": "staging"}}}
    ]


def test_a_deactivated_approvers_approval_no_longer_counts(hub: Hub) -> None:
    release = Team.objects.get(slug="release")
    _two_approvals(hub)
    bob, bob_user = reviewer("bob", release)
    call_id = hub.agent.call("create_deployment", {"branch": "main"})
    item = bob.wait_for_request(call_id, "environment")
    assert bob.respond(item["id"], "accept", {"environment": "staging"}).json()["status"] == "pending"
    bob_user.is_active = False
    bob_user.save(update_fields=["is_active"])
    second = hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
    assert second.status_code == 200 and second.json()["status"] == "pending"


def test_approvals_of_true_and_of_1_are_approvals_of_different_values(hub: Hub, demo_server) -> None:
    """JSON's ``true`` is not ``1`` (Python's ``==`` says it is): a second approval of other arguments
    restarts the count, and what is sent is what the last two approved."""
    servers.server_refresh_tools(server=hub.server)  # the real tool list: create_deployment is destructive
    release = Team.objects.get(slug="release")
    RoutingRule.objects.create(
        position=1,
        name="destructive needs two",
        server=hub.server,
        tool_pattern="*",
        destructive=True,
        gate=True,
        team=release,
        policy=Policy.objects.create(name="two for gates", approvals_required=2),
    )
    bob, _ = reviewer("bob", release)
    carol, _ = reviewer("carol", release)
    call_id = hub.agent.call("create_deployment", {"branch": "main", "environment": "staging"})
    item = hub.reviewer.wait_for_request(call_id, "gate")

    def edit(who: Reviewer, dry_run: object) -> dict:
        arguments = {"branch": "main", "environment": "staging", "dry_run": dry_run}
        response = who.post(
            f"/input-requests/{item['id']}/decide", {"decision": "edit", "arguments": arguments}
        )
        assert response.status_code == 200, response.content
        return response.json()

    assert edit(hub.reviewer, 1)["status"] == "pending"
    assert edit(bob, True)["status"] == "pending"  # other values: the count restarted
    assert AuditEvent.objects.filter(call_id=call_id, verb="input.approvals_restarted").exists()
    assert edit(carol, True)["status"] == "answered"
    done = hub.agent.wait(call_id)
    assert done["arguments"]["dry_run"] is True
    sent = [
        r["body"]["params"]["arguments"]
        for r in demo_support.recorded_requests(demo_server.url)
        if r["body"].get("method") == "tools/call"
    ]
    assert sent == [{"branch": "main", "environment": "staging", "dry_run": True}]


def test_the_same_reviewer_cannot_give_two_of_the_approvals(db) -> None:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    rnd = factories.open_round(factories.call(factories.server()), team_=release)
    InputRequest.objects.filter(round=rnd).update(approvals_required=2)
    ir = rnd.input_requests.get()
    answers.input_respond(
        input_request_id=ir.pk, user=alice, action="accept", content={"environment": "staging"}
    )
    with pytest.raises(Conflict) as again:
        answers.input_respond(
            input_request_id=ir.pk, user=alice, action="accept", content={"environment": "staging"}
        )
    assert again.value.code == "already_approved"


def test_a_sign_in_link_made_for_one_person_needs_only_their_answer(hub: Hub) -> None:
    """A url-mode request is theirs alone (no one else may open it): a policy wanting two approvals cannot
    leave it waiting for a second one nobody can give."""
    _two_approvals(hub, tool_pattern="*")
    carol = factories.user("carol")
    Membership.objects.create(team=Team.objects.get(slug="release"), user=carol)
    _, token = tokens.agent_create(name="carol-agent", servers=[hub.server], acts_for_users=[carol])
    agent = Agent(token)
    carol_reviewer = Reviewer(tokens.personal_token_create(user=carol)[1])
    call_id = agent.call("connect_account", {"service": "github"}, on_behalf_of="carol")
    item = carol_reviewer.wait_for_request(call_id, "sign_in")
    ir = InputRequest.objects.get(pk=item["id"])
    assert ir.assignee == carol and ir.approvals_required == 1

    answered = carol_reviewer.respond(item["id"], "accept")
    assert answered.status_code == 200 and answered.json()["status"] == "answered"
    assert agent.wait(call_id)["status"] == "completed"
