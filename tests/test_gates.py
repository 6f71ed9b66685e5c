"""Gates: a rule stops a call for approval before it is sent; approve, decline or edit; bound to the call.

The REST path runs on the real stack (PostgreSQL, Redis, a Celery worker, the demo MCP server, which records
every request it receives). What happens between an approval and its send (a policy or rule edited) is driven
step by step on the real database: decide, edit, then run the send the worker would run.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    Gate,
    Grant,
    InputRequest,
    Membership,
    Policy,
    Round,
    RoutingRule,
    Team,
    ToolCall,
)
from approvals.services import calls, gate_decisions, gates, grants, sending, servers, tokens
from tests import demo_support, factories
from tests.hub import Hub, Reviewer, set_up_hub
from tests.live import wait_until

pytestmark = pytest.mark.timeout(180)

TOOL = "create_deployment"


def tool_calls(url: str, name: str = TOOL) -> list[dict[str, Any]]:
    """The tools/call requests for `name` the demo server received since its last reset."""
    return [
        r["body"]["params"]
        for r in demo_support.recorded_requests(url)
        if isinstance(r.get("body"), dict)
        and r["body"].get("method") == "tools/call"
        and r["body"]["params"].get("name") == name
    ]


def gate_rule(hub: Hub, **policy: Any) -> RoutingRule:
    """Destructive tools of the demo server need team "release"'s approval before they are sent."""
    return RoutingRule.objects.create(
        position=1,
        name="destructive needs approval",
        server=hub.server,
        tool_pattern="*",
        destructive=True,
        gate=True,
        team=Team.objects.get(slug="release"),
        policy=Policy.objects.create(name="gate policy", **policy) if policy else None,
    )


def reviewer(username: str, role: str = Membership.Role.REVIEWER) -> tuple[Reviewer, Any]:
    user = factories.user(username)
    Membership.objects.create(team=Team.objects.get(slug="release"), user=user, role=role)
    return Reviewer(tokens.personal_token_create(user=user)[1]), user


def decide(who: Reviewer, request_id: str, decision: str, **body: Any) -> Any:
    return who.post(f"/input-requests/{request_id}/decide", {"decision": decision, **body})


def events(call_id: str, prefix: str = "gate.") -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(call_id=call_id, verb__startswith=prefix).order_by("id"))


# ---- on the real stack -----------------------------------------------------------------------------------


@pytest.fixture
def hub(worker, demo_server) -> Hub:
    demo_support.reset(demo_server.url)
    hub = set_up_hub(demo_server.url)
    servers.server_refresh_tools(server=hub.server)  # the real tool list: create_deployment is destructive
    return hub


def test_a_gate_stops_the_call_and_the_edited_arguments_are_sent_once(hub: Hub, demo_server) -> None:
    gate_rule(hub)
    call_id = hub.agent.call(TOOL, {"branch": "main", "environment": "production"})
    item = hub.reviewer.wait_for_request(call_id, "gate")
    # Who asks, the tool as the server claims it, the arguments in full, the digest.
    assert item["gate"]["agent"] == "ci-agent"
    assert item["gate"]["tool"]["annotations"]["destructiveHint"] is True
    assert item["gate"]["tool"]["description"].startswith("Deploy a branch")
    assert item["gate"]["arguments"] == {"branch": "main", "environment": "production"}
    assert len(item["gate"]["digest"]) == 64
    assert item["requested_schema"]["properties"]["branch"]["type"] == "string"
    detail = hub.agent.get(f"/calls/{call_id}").json()
    assert detail["status"] == "awaiting_input"
    assert detail["gate"]["status"] == "open"
    assert tool_calls(demo_server.url) == []  # nothing reached the server

    edited = {"branch": "main", "environment": "staging"}
    response = decide(hub.reviewer, item["id"], "edit", arguments=edited)
    assert response.status_code == 200, response.content
    done = hub.agent.wait(call_id)
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"]["environment"] == "staging"
    assert done["arguments"] == edited
    assert done["gate"]["status"] == "used"
    assert done["gate"]["arguments_asked"] == {"branch": "main", "environment": "production"}
    assert done["gate"]["diff"] == [
        {"path": "environment", "op": "changed", "from": "production", "to": "staging"}
    ]
    sent = tool_calls(demo_server.url)
    assert [params["arguments"] for params in sent] == [edited]  # exactly the approved arguments, once
    verbs = [event.verb for event in events(call_id)]
    assert verbs == ["gate.opened", "gate.edited", "gate.approved", "gate.used"]
    opened, edit, approved, used = events(call_id)
    assert opened.data["digest"] == item["gate"]["digest"]
    assert edit.data["diff"] == done["gate"]["diff"]
    assert approved.data["digest"] == used.data["digest"] == done["gate"]["digest"]
    assert approved.data["digest"] != opened.data["digest"]  # the digest covers the arguments
    assert {opened.data["server"], opened.data["tool"], opened.data["team"]} == {"demo", TOOL, "release"}


def test_a_decline_reaches_the_agent_as_a_readable_error_and_nothing_is_sent(hub: Hub, demo_server) -> None:
    gate_rule(hub)
    call_id = hub.agent.call(TOOL, {"branch": "main", "environment": "staging"})
    item = hub.reviewer.wait_for_request(call_id, "gate")
    response = decide(hub.reviewer, item["id"], "decline", reason="freeze until Monday")
    assert response.status_code == 200, response.content
    done = hub.agent.wait(call_id)
    assert done["status"] == "failed"
    assert done["error"]["code"] == "declined"
    assert done["error"]["reason"] == "freeze until Monday"
    assert "alice declined this call: freeze until Monday" in done["error"]["message"]
    assert tool_calls(demo_server.url) == []
    assert [event.verb for event in events(call_id)] == ["gate.opened", "gate.declined"]


def test_calls_no_gate_rule_matches_are_sent_at_once(hub: Hub, demo_server) -> None:
    gate_rule(hub)
    call_id = hub.agent.call("echo", {"text": "hi"})  # readOnlyHint, not destructive
    assert hub.agent.wait(call_id)["status"] == "completed"
    assert events(call_id) == []


def test_a_tool_changed_upstream_after_approval_voids_it_and_reopens_the_gate(hub: Hub, demo_server) -> None:
    gate_rule(hub)
    call_id = hub.agent.call(TOOL, {"branch": "main", "environment": "staging"})
    item = hub.reviewer.wait_for_request(call_id, "gate")
    # The server changes what the tool says it does; the hub's list is over a minute old by send time.
    demo_support.describe(demo_server.url, TOOL, "Deploy a branch, and delete the previous release.")
    servers_ago = timezone.now() - timedelta(seconds=gates.SEND_FRESHNESS + 30)
    hub.server.__class__.objects.filter(pk=hub.server.pk).update(tools_fetched_at=servers_ago)
    assert decide(hub.reviewer, item["id"], "approve").status_code == 200

    def reopened() -> dict[str, Any] | None:
        return next((i for i in hub.reviewer.inbox() if i["call"] == call_id and i["id"] != item["id"]), None)

    again = wait_until(reopened, 30, 0.1, what="a new gate")
    assert isinstance(again, dict)
    assert again["gate"]["tool"]["description"] == "Deploy a branch, and delete the previous release."
    assert again["gate"]["digest"] != item["gate"]["digest"]
    assert tool_calls(demo_server.url) == []  # the voided approval sent nothing
    voided = [e for e in events(call_id) if e.verb == "gate.voided"]
    assert len(voided) == 1
    assert "the tool's definition changed on the server (description)" in voided[0].data["reason"]
    assert Gate.objects.filter(call_id=call_id, status=Gate.Status.VOIDED).count() == 1

    # Approved again, as the server now describes it: sent once.
    assert decide(hub.reviewer, again["id"], "approve").status_code == 200
    assert hub.agent.wait(call_id)["status"] == "completed"
    assert len(tool_calls(demo_server.url)) == 1


# ---- between approval and send, step by step on the real database ----------------------------------------


@pytest.fixture
def gated(db) -> dict[str, Any]:
    """A server with a stored destructive tool, a gate rule with a policy, an agent, reviewers."""
    alice = factories.user("alice")
    bob = factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    from approvals.models import McpServer

    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[
            {
                "name": "wipe",
                "description": "Delete a bucket.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"bucket": {"type": "string"}, "force": {"type": "boolean"}},
                    "required": ["bucket"],
                },
                "annotations": {"destructiveHint": True},
            }
        ],
        tools_fetched_at=timezone.now(),
    )
    policy = Policy.objects.create(name="one approval")
    rule = RoutingRule.objects.create(
        name="wipes", server=server, tool_pattern="wipe", gate=True, team=release, policy=policy
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    return {"server": server, "policy": policy, "rule": rule, "agent": agent, "alice": alice, "bob": bob}


def submit(gated: dict[str, Any], arguments: dict[str, Any] | None = None) -> ToolCall:
    call, created = calls.call_submit(
        agent=gated["agent"], server_slug="deploy", tool="wipe", arguments=arguments or {"bucket": "logs"}
    )
    assert created
    return call


def gate_request(call: ToolCall) -> InputRequest:
    return InputRequest.objects.get(round__call=call, round__kind=Round.Kind.GATE, status="pending")


def test_an_agents_read_of_a_gated_call_has_its_gate(gated: dict[str, Any]) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from approvals import selectors
    from approvals.api import endpoints

    call = submit(gated)
    expected = selectors.call_detail(selectors.calls_with_rounds().get(pk=call.pk))
    assert expected["gate"]["status"] == "open"
    with CaptureQueriesContext(connection) as queries:
        got = endpoints._own_call(call.agent, call.pk, call.kind)
    assert selectors.call_detail(got) == expected
    assert len(queries) == 4  # the call, its rounds, their requests and, as one round is a gate's, its gates


def test_a_policy_edited_between_approval_and_send_voids_the_approval(gated: dict[str, Any]) -> None:
    call = submit(gated)
    ir = gate_request(call)
    gate_decisions.gate_decide(input_request_id=ir.pk, user=gated["alice"], decision="approve")
    call.refresh_from_db()
    assert call.status == ToolCall.Status.QUEUED
    policy = gated["policy"]
    policy.approvals_required = 2
    policy.save()  # the admin saves so too: the revision goes up
    assert policy.revision == 2

    assert sending._claim(call.pk) is None  # what the worker does next: nothing is sent
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT
    first, second = Gate.objects.filter(call=call).order_by("created_at")
    assert first.status == Gate.Status.VOIDED
    assert "the policy 'one approval' was edited (revision 1 -> 2)" in first.reason
    assert second.status == Gate.Status.OPEN
    assert second.policy_revision == 2
    assert gate_request(call).approvals_required == 2  # the new gate follows the edited policy
    voided = AuditEvent.objects.get(call_id=call.pk, verb="gate.voided")
    assert voided.data["digest"] == first.approved_digest
    assert voided.data["now_digest"] != first.approved_digest


def test_a_rule_edited_between_approval_and_send_voids_the_approval(gated: dict[str, Any]) -> None:
    call = submit(gated)
    gate_decisions.gate_decide(
        input_request_id=gate_request(call).pk, user=gated["alice"], decision="approve"
    )
    rule = gated["rule"]
    rule.name = "wipes (renamed)"
    rule.save()
    assert sending._claim(call.pk) is None
    assert (
        Gate.objects.filter(call=call, status=Gate.Status.VOIDED)
        .get()
        .reason.startswith("the rule 'wipes (renamed)' was edited (revision 1 -> 2)")
    )


def test_an_approval_matching_the_call_is_used_once(gated: dict[str, Any]) -> None:
    call = submit(gated)
    gate_decisions.gate_decide(
        input_request_id=gate_request(call).pk, user=gated["alice"], decision="approve"
    )
    send = sending._claim(call.pk)
    assert send is not None and send.round is None  # the first tools/call may go
    gate = Gate.objects.get(call=call)
    assert gate.status == Gate.Status.USED and gate.used_at is not None
    # The same arguments again are another call: its own gate, not the used approval.
    other = submit(gated)
    assert other.status == ToolCall.Status.AWAITING_INPUT
    assert Gate.objects.get(call=other).status == Gate.Status.OPEN


SAME_AGAIN = {"for": "8h", "arguments": "exact"}


def lapsed_reason(call: ToolCall) -> str:
    """Claim the call's first send, which its lapsed grant stops: the reason audited."""
    assert sending._claim(call.pk) is None  # what the worker does next: nothing is sent
    return str(AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed").data["reason"])


def granted_call(gated: dict[str, Any]) -> ToolCall:
    """A call a remembered grant let through: the first call is approved with "allow the same again", and the
    second, with the same arguments, passes its gate rule without a person."""
    first = submit(gated)
    gate_decisions.gate_decide(
        input_request_id=gate_request(first).pk, user=gated["alice"], decision="approve", grant=SAME_AGAIN
    )
    call = submit(gated)
    assert call.status == ToolCall.Status.QUEUED
    assert not Gate.objects.filter(call=call).exists()
    assert call.grant_id == Grant.objects.get().pk
    return call


def test_a_granted_call_whose_grant_still_covers_it_is_sent(gated: dict[str, Any]) -> None:
    call = granted_call(gated)
    send = sending._claim(call.pk)
    assert send is not None and send.round is None  # the first tools/call may go
    assert not Gate.objects.filter(call=call).exists()
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="gate.grant_lapsed").exists()


def test_a_grant_revoked_before_the_send_stops_the_call_at_a_gate(gated: dict[str, Any]) -> None:
    call = granted_call(gated)
    grants.revoke(grant=Grant.objects.get(), by=gated["alice"])

    assert sending._claim(call.pk) is None  # what the worker does next: nothing is sent
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT and call.attempts == 0
    gate = Gate.objects.get(call=call)
    assert gate.status == Gate.Status.OPEN
    lapsed = AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed")
    assert lapsed.data["reason"].startswith("the grant that let it through was revoked by alice")
    opened = AuditEvent.objects.get(call_id=call.pk, verb="gate.opened")
    assert opened.data["reopened_because"] == lapsed.data["reason"]

    # A person approves it: it goes, once, on that approval.
    gate_decisions.gate_decide(input_request_id=gate_request(call).pk, user=gated["bob"], decision="approve")
    send = sending._claim(call.pk)
    assert send is not None and send.round is None
    assert Gate.objects.get(call=call).status == Gate.Status.USED


def test_a_grant_expired_or_deleted_before_the_send_stops_the_call(gated: dict[str, Any]) -> None:
    expired = granted_call(gated)
    grant = Grant.objects.get()
    Grant.objects.filter(pk=grant.pk).update(
        created_at=timezone.now() - timedelta(hours=9), expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert "was expired at" in lapsed_reason(expired)

    Grant.objects.filter(pk=grant.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    deleted = submit(gated)
    assert deleted.grant_id == grant.pk
    grant.delete()
    assert lapsed_reason(deleted) == "the grant that let it through was deleted"
    assert Gate.objects.get(call=deleted).status == Gate.Status.OPEN


def test_a_tool_changed_since_the_grant_stops_the_call(gated: dict[str, Any]) -> None:
    call = granted_call(gated)
    server = gated["server"]
    tools = [{**server.tools[0], "description": "Delete a bucket and its backups."}]
    type(server).objects.filter(pk=server.pk).update(tools=tools)

    assert lapsed_reason(call) == "the tool's definition changed on the server since the grant let it through"
    assert Gate.objects.get(call=call).status == Gate.Status.OPEN


def test_a_lapsed_grant_with_no_gate_rule_left_lets_the_call_go(gated: dict[str, Any]) -> None:
    call = granted_call(gated)
    grants.revoke(grant=Grant.objects.get(), by=gated["alice"])
    gated["rule"].delete()
    send = sending._claim(call.pk)
    assert send is not None and send.round is None
    assert AuditEvent.objects.filter(call_id=call.pk, verb="gate.grant_lapsed").exists()
    assert not Gate.objects.filter(call=call).exists()
    # A transient fault releases the claim; the retry of the send does not check (or audit) the grant again.
    ToolCall.objects.filter(pk=call.pk).update(status=ToolCall.Status.QUEUED)
    assert sending._claim(call.pk) is not None
    assert AuditEvent.objects.filter(call_id=call.pk, verb="gate.grant_lapsed").count() == 1


def test_no_self_approval_and_two_of_two(gated: dict[str, Any]) -> None:
    policy = gated["policy"]
    policy.approvals_required = 2
    policy.save()
    carol = factories.user("carol")
    Membership.objects.create(team=gated["rule"].team, user=carol)
    agent = gated["agent"]
    agent.acts_for_users.add(gated["alice"])
    call, _ = calls.call_submit(
        agent=agent, server_slug="deploy", tool="wipe", arguments={"bucket": "logs"}, on_behalf_of="alice"
    )
    ir = gate_request(call)
    alice = Reviewer(tokens.personal_token_create(user=gated["alice"])[1])
    refused = decide(alice, str(ir.pk), "approve")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "self_approval"
    assert AuditEvent.objects.get(call_id=call.pk, verb="input.refused").data["code"] == "self_approval"
    bob = Reviewer(tokens.personal_token_create(user=gated["bob"])[1])
    assert decide(bob, str(ir.pk), "approve").status_code == 200
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT  # 1 of 2
    carol_api = Reviewer(tokens.personal_token_create(user=carol)[1])
    assert decide(carol_api, str(ir.pk), "approve").status_code == 200
    call.refresh_from_db()
    assert call.status == ToolCall.Status.QUEUED
    assert Gate.objects.get(call=call).status == Gate.Status.APPROVED


def test_edited_arguments_are_checked_against_the_input_schema(gated: dict[str, Any]) -> None:
    call = submit(gated)
    ir = gate_request(call)
    alice = Reviewer(tokens.personal_token_create(user=gated["alice"])[1])
    bad = decide(alice, str(ir.pk), "edit", arguments={"bucket": 7})
    assert bad.status_code == 422
    assert bad.json()["error"]["fields"] == {"bucket": "7 is not of type 'string'"}
    missing = decide(alice, str(ir.pk), "edit", arguments={"force": True})
    assert missing.status_code == 422
    assert "'bucket' is a required property" in missing.json()["error"]["fields"]["arguments"]
    no_args = decide(alice, str(ir.pk), "edit")
    assert no_args.status_code == 400
    cancel = alice.post(f"/input-requests/{ir.pk}/respond", {"action": "cancel"})
    assert cancel.status_code == 400
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING  # nothing was lost
    assert decide(alice, str(ir.pk), "edit", arguments={"bucket": "tmp", "force": True}).status_code == 200
    call.refresh_from_db()
    assert call.arguments == {"bucket": "tmp", "force": True}


def test_the_digest_binds_server_tool_arguments_agent_person_and_revisions(gated: dict[str, Any]) -> None:
    call = submit(gated)
    gate = Gate.objects.get(call=call)
    base = {
        "call": call,
        "arguments": {"bucket": "logs"},
        "tool": gate.tool,
        "rule": gated["rule"],
        "rule_revision": 1,
        "policy": gated["policy"],
        "policy_revision": 1,
    }
    assert gates.call_digest(**base) == gate.digest
    # Key order and number spelling do not matter (canonical JSON); every part does.
    assert gates.call_digest(**{**base, "arguments": {"bucket": "logs"}}) == gate.digest
    changed = [
        {**base, "arguments": {"bucket": "logs", "force": False}},
        {**base, "tool": {**gate.tool, "description": "Delete a bucket and its backups."}},
        {**base, "rule_revision": 2},
        {**base, "policy_revision": 2},
        {**base, "policy": None},
    ]
    assert len({gates.call_digest(**parts) for parts in changed} | {gate.digest}) == len(changed) + 1
    call.on_behalf_of = gated["bob"]
    assert gates.call_digest(**base) != gate.digest


def test_revisions_go_up_on_every_save(gated: dict[str, Any]) -> None:
    rule = gated["rule"]
    assert rule.revision == 1
    rule.save()
    rule.save(update_fields=["name"])
    rule.refresh_from_db()
    assert rule.revision == 3
    assert RoutingRule.objects.create(name="new", team=rule.team).revision == 1


# ---- the request page ------------------------------------------------------------------------------------


def signed_in(user: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_the_gate_page_shows_who_asks_the_tool_as_claimed_the_arguments_and_the_digest(
    gated: dict[str, Any],
) -> None:
    gated["agent"].acts_for_users.add(gated["bob"])
    call, _ = calls.call_submit(
        agent=gated["agent"],
        server_slug="deploy",
        tool="wipe",
        arguments={"bucket": "logs"},
        on_behalf_of="bob",
    )
    ir = gate_request(call)
    page = signed_in(gated["alice"]).get(f"/requests/{ir.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Asked by the agent <bdi>bot</bdi>, acting for <bdi>bob</bdi>" in html
    assert "Delete a bucket." in html
    assert "may make destructive changes" in html
    assert "&quot;bucket&quot;: &quot;logs&quot;" in html
    assert Gate.objects.get(call=call).digest in html
    # The schema fits the form subset: the editor is a form, prefilled with the asked arguments.
    assert 'name="editor" value="form"' in html
    assert 'value="logs"' in html


def test_the_browser_edit_form_sends_the_edited_arguments(gated: dict[str, Any]) -> None:
    call = submit(gated)
    ir = gate_request(call)
    client = signed_in(gated["alice"])
    bad = client.post(f"/requests/{ir.pk}/decide/", {"decision": "edit", "editor": "form", "f-bucket": ""})
    assert bad.status_code == 422  # bucket is required; the page says so and nothing is recorded
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING
    # The tool is destructive, as the server says: the edit is shown once more before it is sent.
    done = factories.through_second_look(
        client,
        f"/requests/{ir.pk}/decide/",
        {"decision": "edit", "editor": "form", "f-bucket": "tmp", "f-force": "on"},
    )
    assert done.status_code == 302
    call.refresh_from_db()
    assert call.arguments == {"bucket": "tmp", "force": True}
    page = signed_in(gated["alice"]).get(f"/calls/{call.pk}/").content.decode()
    assert "Arguments the reviewer changed" in page


def test_the_json_editor_for_schemas_beyond_the_form_subset(gated: dict[str, Any]) -> None:
    server = gated["server"]
    nested = {
        "type": "object",
        "properties": {"targets": {"type": "array", "items": {"type": "object"}}},
        "required": ["targets"],
    }
    server.tools = [{**server.tools[0], "inputSchema": nested}]
    server.save()
    call = submit(gated, {"targets": [{"bucket": "a"}]})
    ir = gate_request(call)
    client = signed_in(gated["alice"])
    html = client.get(f"/requests/{ir.pk}/").content.decode()
    assert 'name="editor" value="json"' in html
    broken = client.post(
        f"/requests/{ir.pk}/decide/", {"decision": "edit", "editor": "json", "arguments_json": "{not json"}
    )
    assert broken.status_code == 422
    assert "This is not valid JSON" in broken.content.decode()
    wrong = client.post(
        f"/requests/{ir.pk}/decide/",
        {"decision": "edit", "editor": "json", "arguments_json": '{"targets": 1}'},
    )
    assert wrong.status_code == 422
    assert "1 is not of type" in wrong.content.decode()
    ok = factories.through_second_look(
        client,
        f"/requests/{ir.pk}/decide/",
        {"decision": "edit", "editor": "json", "arguments_json": '{"targets": [{"bucket": "b"}]}'},
    )
    assert ok.status_code == 302
    call.refresh_from_db()
    assert call.arguments == {"targets": [{"bucket": "b"}]}


def test_the_browser_decline_ends_the_call_with_the_reason(gated: dict[str, Any]) -> None:
    call = submit(gated)
    ir = gate_request(call)
    response = signed_in(gated["bob"]).post(
        f"/requests/{ir.pk}/decide/", {"decision": "decline", "reason": "no"}
    )
    assert response.status_code == 302
    call.refresh_from_db()
    assert call.status == ToolCall.Status.FAILED
    assert call.error["code"] == "declined"
    assert call.error["message"] == "bob declined this call: no. It was not sent."


# ---- the holder path (handshake-era and stdio servers) ---------------------------------------------------


def test_the_holder_checks_the_approval_before_its_first_send(gated: dict[str, Any]) -> None:
    from approvals.models import McpServer
    from approvals.services import holding

    McpServer.objects.filter(pk=gated["server"].pk).update(era=McpServer.Era.HANDSHAKE)
    holder = holding.holder_start(name="test-holder")
    kept = submit(gated)
    edited = submit(gated, {"bucket": "other"})
    for call in (kept, edited):
        gate_decisions.gate_decide(
            input_request_id=gate_request(call).pk, user=gated["alice"], decision="approve"
        )
    assert sorted(holding.holder_claim(holder_id=holder, limit=5)) == sorted([str(kept.pk), str(edited.pk)])

    assert holding.held_sending(call_id=kept.pk, holder_id=holder)  # unchanged: sent, the approval used
    assert Gate.objects.get(call=kept).status == Gate.Status.USED

    policy = gated["policy"]
    policy.forbid_self_approval = False
    policy.save()
    assert not holding.held_sending(call_id=edited.pk, holder_id=holder)  # changed: not sent
    edited.refresh_from_db()
    assert edited.status == ToolCall.Status.AWAITING_INPUT and edited.holder_id is None
    assert edited.started_at is None  # nothing left the hub
    assert list(Gate.objects.filter(call=edited).values_list("status", flat=True).order_by("created_at")) == [
        Gate.Status.VOIDED,
        Gate.Status.OPEN,
    ]


def test_the_holder_checks_a_grant_before_its_first_send(gated: dict[str, Any]) -> None:
    from approvals.models import McpServer
    from approvals.services import holding

    McpServer.objects.filter(pk=gated["server"].pk).update(era=McpServer.Era.HANDSHAKE)
    holder = holding.holder_start(name="test-holder")
    call = granted_call(gated)
    grants.revoke(grant=Grant.objects.get(), by=gated["alice"])
    assert str(call.pk) in holding.holder_claim(holder_id=holder, limit=5)  # with the approved first call

    assert not holding.held_sending(call_id=call.pk, holder_id=holder)  # the grant lapsed: not sent
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_INPUT and call.holder_id is None
    assert call.started_at is None  # nothing left the hub
    assert Gate.objects.get(call=call).status == Gate.Status.OPEN
    assert AuditEvent.objects.filter(call_id=call.pk, verb="gate.grant_lapsed").count() == 1


def test_the_gateway_reads_a_decline_to_the_agent() -> None:
    from approvals.gateway import catalog
    from approvals.gateway.server import final_result

    state = catalog.CallState(
        id="c1",
        status="failed",
        is_final=True,
        result=None,
        result_truncated=False,
        error={"code": "declined", "message": "alice declined this call: not today. It was not sent."},
        waiting_for="",
        gate={"status": "declined", "diff": []},
    )
    result = final_result(state)
    assert result.is_error is True
    assert result.content[0].text == (
        "The call was declined and not sent: alice declined this call: not today. It was not sent."
    )
    assert result.meta is not None
    assert result.meta["elicit-hub/call"]["gate"]["status"] == "declined"


def test_a_repeat_of_the_asked_arguments_finds_the_call_a_reviewer_edited(gated: dict[str, Any]) -> None:
    call, created = calls.call_submit_or_repeat(
        agent=gated["agent"], server_slug="deploy", tool="wipe", arguments={"bucket": "logs"}, window=600
    )
    assert created
    gate_decisions.gate_decide(
        input_request_id=gate_request(call).pk,
        user=gated["alice"],
        decision="edit",
        arguments={"bucket": "tmp"},
    )
    again, created = calls.call_submit_or_repeat(
        agent=gated["agent"], server_slug="deploy", tool="wipe", arguments={"bucket": "logs"}, window=600
    )
    assert (again.pk, created) == (call.pk, False)


def test_a_gate_nobody_decides_expires_and_nothing_is_sent(gated: dict[str, Any]) -> None:
    from approvals.services import escalation

    call = submit(gated)
    rnd = Round.objects.get(call=call, kind=Round.Kind.GATE)
    assert escalation.round_expire(round_id=rnd.pk, now=rnd.deadline + timedelta(seconds=1))
    call.refresh_from_db()
    assert call.status == ToolCall.Status.EXPIRED
    assert call.error["message"] == "No one approved this call before the deadline; it was not sent."
    assert Gate.objects.get(call=call).status == Gate.Status.EXPIRED
    assert sending._claim(call.pk) is None


def test_what_a_gated_call_waits_for_and_the_queue_card(gated: dict[str, Any]) -> None:
    from approvals.gateway import catalog

    call = submit(gated)
    state = catalog.call_state(call.pk)
    assert state is not None
    assert state.waiting_for == "waiting for approval to send by release: 0 of 1 approval"
    queue = signed_in(gated["alice"]).get("/").content.decode()
    assert "Approve before sending" in queue
    assert "bot asks to call wipe on Deploy bot." in queue


def test_the_admin_shows_gates_and_refuses_a_gate_rule_with_a_mode(gated: dict[str, Any]) -> None:
    call = submit(gated)
    admin = signed_in(factories.user("root", is_staff=True, is_superuser=True))
    page = admin.get(f"/admin/approvals/toolcall/{call.pk}/change/").content.decode()
    assert Gate.objects.get(call=call).digest in page
    rule = gated["rule"]
    form = {
        "position": 1,
        "name": "gate with a mode",
        "enabled": "on",
        "tool_pattern": "*",
        "mode": "form",
        "conditions": "[]",
        "gate": "on",
        "team": rule.team_id,
        "answered_by": "team",
    }
    refused = admin.post("/admin/approvals/routingrule/add/", form)
    assert refused.status_code == 200
    assert "A gate stops calls, whatever mode a later question has" in refused.content.decode()
    by_agent = admin.post(
        "/admin/approvals/routingrule/add/", {**form, "mode": "", "answered_by": "requester"}
    )
    assert "A gate is decided by the team&#x27;s reviewers" in by_agent.content.decode()
    saved = admin.post(
        f"/admin/approvals/routingrule/{rule.pk}/change/", {**form, "mode": "", "name": "wipes"}
    )
    assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.context else saved
    rule.refresh_from_db()
    assert rule.revision == 2  # an admin save is an edit: approvals under revision 1 are void at send
