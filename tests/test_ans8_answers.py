"""How a reviewer's answer is taken in the browser: what it would be refused for is said before a second
look, not after it; and an answer from someone who may not give it is refused, and recorded, whatever it
holds (the values are not read first)."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from approvals.models import AuditEvent, Decision, InputRequest, Membership, Policy
from tests import factories
from tests.test_grants_scope import gate_request, submit
from tests.test_grants_scope import world as scope_world  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {"replicas": {"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 9}},
    "required": ["replicas"],
}
ANSWER = {"action": "accept", "f-replicas": "3"}


@pytest.fixture
def world(client: Any) -> Any:
    alice, bob = factories.user("alice"), factories.user("bob")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    two = Policy.objects.create(name="two eyes", risk=Policy.Risk.HIGH, approvals_required=2)
    rnd = factories.open_round(factories.call(deploy), team_=release)
    ir = rnd.input_requests.get()
    InputRequest.objects.filter(pk=ir.pk).update(requested_schema=SCHEMA, policy=two, approvals_required=2)
    client.force_login(alice)
    return SimpleNamespace(alice=alice, bob=bob, ir=InputRequest.objects.get(pk=ir.pk))


def _token(html: str) -> str:
    found = re.search(r'name="reviewed" value="([^"]+)"', html)
    assert found, "the page carries no review token"
    return found.group(1)


def test_a_second_approval_by_the_same_reviewer_is_refused_before_the_second_look(client, world) -> None:
    url = f"/requests/{world.ir.pk}/respond/"
    first = client.post(url, ANSWER)
    assert first.status_code == 200 and "Check before sending" in first.text
    recorded = client.post(url, {**ANSWER, "reviewed": _token(first.text)})
    assert recorded.status_code == 302
    assert Decision.objects.filter(input_request=world.ir, is_final=False).count() == 1

    # The same reviewer again (a second tab, Back and submit): told at once, not shown the review first.
    again = client.post(url, ANSWER)

    assert again.status_code == 409, again.text[:500]
    assert "Check before sending" not in again.text
    assert "You have already approved this request" in again.text
    assert Decision.objects.filter(input_request=world.ir).count() == 1
    assert AuditEvent.objects.filter(input_request_id=world.ir.pk, verb="input.approved").count() == 1


@pytest.fixture
def wipes(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``test_grants_scope``'s gated wipes (a tool the server calls destructive), needing two approvals."""
    found: dict[str, Any] = request.getfixturevalue("scope_world")
    found["wipes"].policy = Policy.objects.create(name="two approvals", approvals_required=2)
    found["wipes"].save()
    return found


def test_a_second_approval_of_a_gate_by_the_same_reviewer_is_refused_before_the_second_look(
    client, wipes
) -> None:
    ir = gate_request(submit(wipes, bucket="logs", env="staging"))
    assert ir is not None and ir.approvals_required == 2
    client.force_login(wipes["alice"])
    url = f"/requests/{ir.pk}/decide/"
    assert factories.through_second_look(client, url, {"decision": "approve"}).status_code == 302

    again = client.post(url, {"decision": "approve"})

    assert again.status_code == 409, again.text[:500]
    assert "Check before sending" not in again.text
    assert "You have already approved this request" in again.text
    assert Decision.objects.filter(input_request=ir).count() == 1
    assert AuditEvent.objects.filter(input_request_id=ir.pk, verb="input.approved").count() == 1
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING


def test_an_answer_from_a_viewer_is_refused_and_recorded_whatever_it_holds(client, world) -> None:
    viewer = factories.user("victor")
    Membership.objects.create(team=world.ir.team, user=viewer, role=Membership.Role.VIEWER)
    client.force_login(viewer)
    url = f"/requests/{world.ir.pk}/respond/"

    for values in ({"f-replicas": "many"}, {"f-replicas": "3"}):
        refused = client.post(url, {"action": "accept", **values})

        # Not a reviewer is the news, not what was wrong with the values; and each refusal is on record.
        assert refused.status_code == 403, refused.text[:300]
        assert "You are not a reviewer for the team" in refused.text
    events = AuditEvent.objects.filter(input_request_id=world.ir.pk, verb="input.refused")
    assert [(e.actor_label, e.data["code"]) for e in events] == [("victor", "not_a_reviewer")] * 2
    world.ir.refresh_from_db()
    assert world.ir.status == InputRequest.Status.PENDING and not world.ir.decisions.exists()


def test_a_gate_edit_from_a_viewer_is_refused_and_recorded_whatever_it_holds(client, wipes) -> None:
    ir = gate_request(submit(wipes, bucket="logs", env="staging"))
    assert ir is not None
    viewer = factories.user("victor")
    Membership.objects.create(team=wipes["release"], user=viewer, role=Membership.Role.VIEWER)
    client.force_login(viewer)
    url = f"/requests/{ir.pk}/decide/"

    for text in ("{not json", '{"bucket": "tmp"}'):
        refused = client.post(url, {"decision": "edit", "editor": "json", "arguments_json": text})

        assert refused.status_code == 403, refused.text[:300]
        assert "You are not a reviewer for the team" in refused.text
    events = AuditEvent.objects.filter(input_request_id=ir.pk, verb="input.refused")
    assert [(e.actor_label, e.data["code"]) for e in events] == [("victor", "not_a_reviewer")] * 2
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING and not ir.decisions.exists()
