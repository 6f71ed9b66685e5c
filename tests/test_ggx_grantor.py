"""A grant is its grantor's word for later calls: it holds only while they could still give it. Removed from
the grant's team, lowered to viewer, deactivated or deleted, and the grant lets nothing through (at submit and
again before the first send), as their standing approval of an N-of-M request no longer counts. On the real
database, through the services the API and the dashboard call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    Grant,
    InputRequest,
    McpServer,
    Membership,
    Round,
    RoutingRule,
    ToolCall,
)
from approvals.services import calls, gate_decisions, gates, tokens
from tests import factories

pytestmark = pytest.mark.django_db

ON_LOGS = {
    "for": "until_revoked",
    "arguments": "conditions",
    "conditions": [{"argument": "bucket", "op": "==", "value": "logs"}],
}


@pytest.fixture
def world() -> dict[str, Any]:
    alice, bob = factories.user("alice"), factories.user("bob")
    root = factories.user("root", is_superuser=True, is_staff=True)
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (bob, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug="deploy",
        name="Deploy bot",
        url="http://127.0.0.1:9/mcp",
        tools=[
            {
                "name": "wipe",
                "description": "Delete a bucket.",
                "inputSchema": {"type": "object", "properties": {"bucket": {"type": "string"}}},
            }
        ],
        tools_fetched_at=timezone.now(),
        default_team=release,
    )
    RoutingRule.objects.create(
        position=1, name="wipes", server=server, tool_pattern="wipe", gate=True, team=release
    )
    agent, _ = tokens.agent_create(name="bot", servers=[server])
    return {"alice": alice, "bob": bob, "root": root, "release": release, "server": server, "agent": agent}


def submit(world: dict[str, Any], bucket: str = "logs") -> ToolCall:
    call, created = calls.call_submit(
        agent=world["agent"], server_slug="deploy", tool="wipe", arguments={"bucket": bucket}
    )
    assert created
    return call


def gate_request(call: ToolCall) -> InputRequest | None:
    return InputRequest.objects.filter(
        round__call=call, round__kind=Round.Kind.GATE, status="pending"
    ).first()


def granted_by(world: dict[str, Any], who: str) -> Grant:
    ir = gate_request(submit(world))
    assert ir is not None
    gate_decisions.gate_decide(input_request_id=ir.pk, user=world[who], decision="approve", grant=ON_LOGS)
    return Grant.objects.get()


def _remove(world: dict[str, Any]) -> None:
    Membership.objects.filter(user=world["alice"], team=world["release"]).delete()


def _demote(world: dict[str, Any]) -> None:
    Membership.objects.filter(user=world["alice"], team=world["release"]).update(role=Membership.Role.VIEWER)


def _deactivate(world: dict[str, Any]) -> None:
    world["alice"].is_active = False
    world["alice"].save()


def _delete(world: dict[str, Any]) -> None:
    world["alice"].delete()


GONE: dict[str, Callable[[dict[str, Any]], None]] = {
    "removed from the team": _remove,
    "lowered to viewer": _demote,
    "deactivated": _deactivate,
    "deleted": _delete,
}


def test_the_grant_lets_the_same_call_through_while_its_grantor_stands(world) -> None:
    made = granted_by(world, "alice")
    call = submit(world)
    assert call.status == ToolCall.Status.QUEUED and call.grant_id == made.pk
    assert gates.gate_at_send(call) is True


@pytest.mark.parametrize("gone", list(GONE))
def test_a_grant_whose_grantor_can_no_longer_approve_lets_nothing_through(world, gone: str) -> None:
    granted_by(world, "alice")
    GONE[gone](world)
    call = submit(world)
    assert call.status == ToolCall.Status.AWAITING_INPUT and call.grant_id is None
    assert gate_request(call) is not None
    assert not AuditEvent.objects.filter(call_id=call.pk, verb="gate.granted").exists()


@pytest.mark.parametrize("gone", ["removed from the team", "deactivated", "deleted"])
def test_a_grantor_gone_between_submit_and_send_stops_the_call_at_a_gate(world, gone: str) -> None:
    made = granted_by(world, "alice")
    call = submit(world)
    assert call.grant_id == made.pk
    GONE[gone](world)
    assert gates.gate_at_send(call) is False
    lapsed = AuditEvent.objects.get(call_id=call.pk, verb="gate.grant_lapsed")
    assert "granted it" in lapsed.data["reason"]
    assert gate_request(call) is not None


def test_a_superusers_grant_stands_until_the_flag_is_taken_away(world) -> None:
    made = granted_by(world, "root")
    assert submit(world).grant_id == made.pk
    world["root"].is_superuser = False
    world["root"].save()
    assert submit(world).grant_id is None


def test_the_grants_page_says_a_grant_of_a_grantor_gone_lets_nothing_through(world) -> None:
    made = granted_by(world, "alice")
    client = Client()
    client.force_login(world["bob"])
    page = client.get("/grants/").content.decode()
    assert f'data-grant="{made.pk}"' in page and "data-grantor-gone" not in page
    _demote(world)
    page = client.get("/grants/").content.decode()
    assert "data-grantor-gone" in page


def test_the_api_says_whether_an_active_grant_lets_calls_through(world) -> None:
    made = granted_by(world, "alice")
    _, token = tokens.personal_token_create(user=world["bob"], name="bot")
    api = Client(headers={"authorization": f"Bearer {token}"})

    def listed() -> dict[str, Any]:
        (item,) = api.get("/api/v1/grants").json()
        assert item["id"] == str(made.pk)
        return item

    assert listed()["lets_calls_through"] is True
    _remove(world)
    item = listed()
    assert item["state"] == "active" and item["lets_calls_through"] is False


def test_the_revoke_page_says_why_a_grant_lets_nothing_through(world) -> None:
    made = granted_by(world, "alice")
    _deactivate(world)
    client = Client()
    client.force_login(world["bob"])
    page = client.get(f"/grants/{made.pk}/revoke/").content.decode()
    assert "alice, who granted it, was deactivated" in page


def test_a_revoke_posted_without_the_csrf_token_revokes_nothing(world) -> None:
    made = granted_by(world, "alice")
    client = Client(enforce_csrf_checks=True)
    client.force_login(world["bob"])
    assert client.post(f"/grants/{made.pk}/revoke/").status_code == 403
    made.refresh_from_db()
    assert made.revoked_at is None
    assert not AuditEvent.objects.filter(verb="grant.revoked").exists()
    page = client.get(f"/grants/{made.pk}/revoke/")
    token = page.cookies["csrftoken"].value
    assert client.post(f"/grants/{made.pk}/revoke/", {"csrfmiddlewaretoken": token}).status_code == 302
    made.refresh_from_db()
    assert made.revoked_by == world["bob"]
    assert AuditEvent.objects.filter(verb="grant.revoked", data__grant=str(made.pk)).count() == 1
