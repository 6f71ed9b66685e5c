"""A second look before a risky approval: the hub's policy rates a request high risk, or the server says its
tool is destructive, so the browser's first "Approve and send" shows the values once more with what they do,
and only a submit of exactly those values, by that reviewer, is sent (UX.md, "Actions")."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
from django.core import signing
from django.test import Client
from django.utils import timezone

from approvals import second_look
from approvals.models import AuditEvent, InputRequest, Membership, Policy, RoutingRule
from approvals.services import calls, tokens
from tests import factories

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {
        "environment": {
            "type": "string",
            "title": "Environment",
            "oneOf": [
                {"const": "staging", "title": "Staging"},
                {"const": "production", "title": "Production"},
            ],
        },
        "replicas": {"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 9},
        "note": {"type": "string", "title": "Note"},
    },
    "required": ["environment", "replicas"],
}


@pytest.fixture
def world(client) -> Any:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    high = Policy.objects.create(name="prod deploys", risk=Policy.Risk.HIGH)
    low = Policy.objects.create(name="everyday", risk=Policy.Risk.LOW)
    client.force_login(alice)
    return SimpleNamespace(alice=alice, bob=bob, release=release, deploy=deploy, high=high, low=low)


def ask(world: Any, policy: Policy | None) -> InputRequest:
    rnd = factories.open_round(factories.call(world.deploy), team_=world.release)
    ir = rnd.input_requests.get()
    ir.requested_schema = SCHEMA
    ir.policy = policy
    ir.save(update_fields=["requested_schema", "policy"])
    return ir


ANSWER = {"action": "accept", "f-environment": "production", "f-replicas": "3", "f-note": ""}


def token_in(html: str) -> str:
    found = re.search(r'name="reviewed" value="([^"]+)"', html)
    assert found, "the form carries no review token"
    return found.group(1)


def answered(ir: InputRequest) -> bool:
    ir.refresh_from_db()
    return ir.status == InputRequest.Status.ANSWERED


def test_a_high_risk_approval_is_shown_again_then_sent_as_reviewed(client, world) -> None:
    ir = ask(world, world.high)

    first = client.post(f"/requests/{ir.pk}/respond/", ANSWER)

    assert first.status_code == 200
    html = first.content.decode()
    assert "Check before sending" in html
    assert "sends 2 values to <bdi>Deploy bot</bdi>, which continues <bdi>create_deployment</bdi>" in html
    assert "rates it high risk" in html and "prod deploys" in html
    assert re.search(r"<dt><bdi dir=\"auto\">Replicas</bdi></dt>\s*<dd><code dir=\"auto\">3</code>", html)
    assert '(<bdi dir="auto">Production</bdi>)' in html  # the option's label beside the value sent
    assert "left empty: not sent" in html  # the optional note
    assert "Confirm and send" in html
    assert 'value="3"' in html  # what was typed stays in the form
    assert not answered(ir)
    assert not AuditEvent.objects.filter(input_request_id=ir.pk, verb="input.answered").exists()

    second = client.post(f"/requests/{ir.pk}/respond/", {**ANSWER, "reviewed": token_in(html)})

    assert second.status_code == 302
    assert answered(ir)
    assert ir.content == {"environment": "production", "replicas": 3}
    assert AuditEvent.objects.filter(input_request_id=ir.pk, verb="input.answered").count() == 1


def test_a_value_changed_after_the_review_is_reviewed_again(client, world) -> None:
    ir = ask(world, world.high)
    reviewed = token_in(client.post(f"/requests/{ir.pk}/respond/", ANSWER).content.decode())

    changed = client.post(f"/requests/{ir.pk}/respond/", {**ANSWER, "f-replicas": "9", "reviewed": reviewed})

    assert changed.status_code == 200
    assert re.search(
        r"<dt><bdi dir=\"auto\">Replicas</bdi></dt>\s*<dd><code dir=\"auto\">9</code>", changed.text
    )
    assert not answered(ir)
    again = client.post(
        f"/requests/{ir.pk}/respond/", {**ANSWER, "f-replicas": "9", "reviewed": token_in(changed.text)}
    )
    assert again.status_code == 302 and answered(ir)
    assert ir.content == {"environment": "production", "replicas": 9}


def test_another_reviewers_token_a_forged_one_or_an_expired_one_is_not_a_review(client, world) -> None:
    ir = ask(world, world.high)
    values = {"environment": "production", "replicas": 3}
    bobs = second_look.token(ir, world.bob, values)
    other_request = ask(world, world.high)
    elsewhere = second_look.token(other_request, world.alice, values)
    forged = signing.dumps(
        {"r": str(ir.pk), "u": str(world.alice.pk), "d": "0" * 64}, salt="approvals.second_look"
    )
    expired = signing.TimestampSigner(salt="approvals.second_look").sign_object(
        {"r": str(ir.pk), "u": str(world.alice.pk), "d": second_look._digest(values)}
    )

    for given in (bobs, elsewhere, forged, "not-a-token", "x" * 4000):
        response = client.post(f"/requests/{ir.pk}/respond/", {**ANSWER, "reviewed": given})
        assert response.status_code == 200 and "Check before sending" in response.text, given[:20]
    assert not answered(ir)
    assert second_look.confirmed(expired, ir, world.alice, values)
    assert not second_look.confirmed(expired, ir, world.alice, {**values, "replicas": 4})


def test_a_token_older_than_its_lifetime_is_refused(world, monkeypatch) -> None:
    ir = ask(world, world.high)
    values = {"environment": "staging", "replicas": 1}
    given = second_look.token(ir, world.alice, values)
    assert second_look.confirmed(given, ir, world.alice, values)
    monkeypatch.setattr(second_look, "MAX_AGE", -1)
    assert not second_look.confirmed(given, ir, world.alice, values)


def test_a_low_risk_request_is_sent_at_the_first_approval(client, world) -> None:
    for policy in (world.low, None):
        ir = ask(world, policy)
        page = client.get(f"/requests/{ir.pk}/").text
        assert "You will be shown the values once more" not in page
        response = client.post(f"/requests/{ir.pk}/respond/", ANSWER)
        assert response.status_code == 302 and answered(ir)


def test_a_tool_the_server_calls_destructive_needs_the_second_look_too(client, world) -> None:
    world.deploy.tools = [{"name": "create_deployment", "annotations": {"destructiveHint": True}}]
    world.deploy.save(update_fields=["tools"])
    ir = ask(world, None)

    page = client.get(f"/requests/{ir.pk}/").text
    assert "You will be shown the values once more" in page
    response = client.post(f"/requests/{ir.pk}/respond/", ANSWER)

    assert response.status_code == 200 and "may make destructive changes" in response.text
    assert not answered(ir)


def test_invalid_values_are_refused_before_any_review(client, world) -> None:
    ir = ask(world, world.high)
    response = client.post(f"/requests/{ir.pk}/respond/", {**ANSWER, "f-replicas": "12"})
    assert response.status_code == 422
    assert "Check before sending" not in response.text and "There is a problem" in response.text


def test_declining_a_high_risk_request_needs_no_second_step(client, world) -> None:
    ir = ask(world, world.high)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "decline", "reason": "not today"})
    assert response.status_code == 302
    ir.refresh_from_db()
    assert ir.action == InputRequest.Action.DECLINE


def test_the_risk_is_shown_on_the_request_page_and_the_queue_card(client, world) -> None:
    ir = ask(world, world.high)
    ask(world, world.low)

    page = client.get(f"/requests/{ir.pk}/").text
    queue = client.get("/").text

    assert "Risk: <strong>High</strong>, from the hub's policy “<bdi>prod deploys</bdi>”" in page
    assert "You will be shown the values once more" in page
    assert queue.count('data-risk="high"') == 1
    assert 'data-risk="low"' not in queue  # low risk is the norm, not a badge


def test_an_api_answer_needs_no_second_step(world) -> None:
    ir = ask(world, world.high)
    _, raw = tokens.personal_token_create(user=world.alice)
    response = Client().post(
        f"/api/v1/input-requests/{ir.pk}/respond",
        {"action": "accept", "content": {"environment": "staging", "replicas": 2}},
        content_type="application/json",
        headers={"authorization": f"Bearer {raw}"},
    )
    assert response.status_code == 200, response.content
    assert answered(ir)


def test_a_refusal_to_come_is_said_before_the_review(client, world) -> None:
    ir = ask(world, world.high)
    ir.round.call.on_behalf_of = world.alice  # the policy forbids answering one's own agent's request
    ir.round.call.save(update_fields=["on_behalf_of"])

    response = client.post(f"/requests/{ir.pk}/respond/", ANSWER)

    assert response.status_code == 403
    assert "Check before sending" not in response.text and "Another reviewer must" in response.text
    assert AuditEvent.objects.filter(input_request_id=ir.pk, verb="input.refused").count() == 1
    assert not answered(ir)


@pytest.fixture
def gated(world) -> Any:
    """A gate on the deploy server's `scale` tool (not destructive, by the server's word), for release."""
    world.deploy.tools = [
        {
            "name": "scale",
            "inputSchema": {
                "type": "object",
                "properties": {"replicas": {"type": "integer"}},
                "required": ["replicas"],
            },
        }
    ]
    world.deploy.tools_fetched_at = timezone.now()
    world.deploy.save()
    RoutingRule.objects.create(
        name="scaling",
        server=world.deploy,
        tool_pattern="scale",
        gate=True,
        team=world.release,
        policy=world.high,
    )
    agent, _ = factories.agent("ci-bot", servers=[world.deploy])
    call, _ = calls.call_submit(agent=agent, server_slug="deploy", tool="scale", arguments={"replicas": 2})
    world.call = call
    world.gate = InputRequest.objects.get(round__call=call, key="gate")
    return world


def test_a_high_risk_gate_is_approved_after_a_second_look_at_the_arguments(client, gated) -> None:
    url = f"/requests/{gated.gate.pk}/decide/"
    assert "You will be shown the arguments once more" in client.get(f"/requests/{gated.gate.pk}/").text

    first = client.post(url, {"decision": "approve"})

    assert first.status_code == 200
    assert "Confirm and send calls <bdi>scale</bdi> on <bdi>Deploy bot</bdi>" in first.text
    assert "&quot;replicas&quot;: 2" in first.text and "rates it high risk" in first.text
    gated.gate.refresh_from_db()
    assert gated.gate.status == InputRequest.Status.PENDING
    assert not AuditEvent.objects.filter(call_id=gated.call.pk, verb="gate.approved").exists()

    fields = factories.second_look_fields(first.text)
    assert fields["decision"] == ["approve"] and fields["reviewed"]
    done = client.post(url, fields)

    assert done.status_code == 302
    assert AuditEvent.objects.filter(call_id=gated.call.pk, verb="gate.approved").count() == 1


def test_a_gate_edit_reviewed_cannot_be_swapped_for_other_arguments(client, gated) -> None:
    url = f"/requests/{gated.gate.pk}/decide/"
    edit = {"decision": "edit", "editor": "json", "arguments_json": '{"replicas": 3}'}
    fields = factories.second_look_fields(client.post(url, edit).text)

    swapped = client.post(url, {**fields, "arguments_json": '{"replicas": 300}'})
    as_asked = client.post(url, {**fields, "decision": "approve"})
    with_a_grant = client.post(url, {**fields, "grant_for": "until_revoked", "grant_arguments": "exact"})

    for response in (swapped, as_asked, with_a_grant):
        assert response.status_code == 200 and "Check before sending" in response.text
    assert "&quot;replicas&quot;: 300" in swapped.text  # the review shows what would now be sent
    gated.gate.refresh_from_db()
    assert gated.gate.status == InputRequest.Status.PENDING
    assert client.post(url, fields).status_code == 302
    gated.call.refresh_from_db()
    assert gated.call.arguments == {"replicas": 3}


def test_declining_a_high_risk_gate_needs_no_second_step(client, gated) -> None:
    response = client.post(f"/requests/{gated.gate.pk}/decide/", {"decision": "decline", "reason": "no"})
    assert response.status_code == 302
    gated.gate.refresh_from_db()
    assert gated.gate.action == InputRequest.Action.DECLINE


def test_the_queue_filters_by_risk_and_counts_with_the_filter(client, world) -> None:
    medium = Policy.objects.create(name="staging", risk=Policy.Risk.MEDIUM)
    high, middle, low, unset = (
        ask(world, world.high),
        ask(world, medium),
        ask(world, world.low),
        ask(world, None),
    )

    def shown(query: str) -> set[str]:
        return set(re.findall(r'data-request="([0-9a-f-]{36})"', client.get("/" + query).text))

    assert shown("?risk=high") == {str(high.pk)}
    assert shown("?risk=medium") == {str(high.pk), str(middle.pk)}
    assert shown("") == shown("?risk=bogus") == {str(r.pk) for r in (high, middle, low, unset)}
    assert 'data-filter-risk="high"' in client.get("/?risk=high").text  # for cards arriving live
    assert client.get("/queue/count/?risk=medium").json() == {"pending": 2}
    card = client.get("/").text
    assert card.count('data-risks="high"') == 1 and card.count('data-risks="medium"') == 1
