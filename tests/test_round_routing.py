"""A round's routing: each of its requests goes by the first rule that matches it, and the rules are read once
for the round, not once per request (a round may hold many)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import McpServer, Round, RoutingRule
from approvals.services import gates
from approvals.services.rounds import round_open
from tests import factories

pytestmark = pytest.mark.django_db


def _form(message: str) -> dict[str, Any]:
    params = {"mode": "form", "message": message, "requestedSchema": factories.ENVIRONMENT_SCHEMA}
    return {"method": "elicitation/create", "params": params}


def _link(message: str) -> dict[str, Any]:
    params = {"mode": "url", "message": message, "url": "https://registry.example/sign-in"}
    return {"method": "elicitation/create", "params": params}


def test_a_round_reads_the_routing_rules_once_and_routes_each_request_by_its_own_mode() -> None:
    release, security, ops = factories.team("release"), factories.team("security"), factories.team("ops")
    server = McpServer.objects.create(slug="deployer", name="Deployer", url="https://deployer.example/mcp")
    server.default_team = ops
    server.save(update_fields=["default_team"])
    RoutingRule.objects.create(position=10, name="sign-ins", mode="url", team=security)
    RoutingRule.objects.create(position=20, name="deploy forms", tool_pattern="create_*", team=release)
    call = factories.call(server, tool="create_deployment")
    requests = {
        "environment": _form("Pick the environment"),
        "sign_in": _link("Sign in to the registry"),
        "region": _form("Pick the region"),
    }

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        rnd = round_open(
            call=call,
            input_requests=requests,
            raw={"resultType": "input_required"},
            request_state=None,
            received_at=timezone.now(),
        )

    rule_reads = [q["sql"] for q in queries if 'FROM "approvals_routingrule"' in q["sql"]]
    assert len(rule_reads) == 1, rule_reads
    routed = {
        ir.key: (ir.team.slug, ir.rule.name) for ir in rnd.input_requests.select_related("team", "rule")
    }
    assert routed == {
        "environment": ("release", "deploy forms"),
        "sign_in": ("security", "sign-ins"),
        "region": ("release", "deploy forms"),
    }
    assert Round.objects.get(pk=rnd.pk).status == Round.Status.OPEN


def test_the_rules_reads_leave_their_servers_stored_json_unread() -> None:
    """A rule names its server by slug. The routing rules (read for every round) and the gate rules (read for
    every call submitted) select none of the server's stored JSON: its tool list, its probe, its
    credentials. A rule still matches by its server."""
    release = factories.team("release")
    server = McpServer.objects.create(slug="deployer", name="Deployer", url="https://deployer.example/mcp")
    McpServer.objects.filter(pk=server.pk).update(
        tools=[{"name": "create_deployment", "inputSchema": {"type": "object"}}],
        probe={"ok": True, "tools": [{"name": "create_deployment"}]},
    )
    RoutingRule.objects.create(position=10, name="deployer forms", server=server, team=release)
    RoutingRule.objects.create(position=10, name="deployer gate", server=server, team=release, gate=True)
    call = factories.call(server, tool="create_deployment")

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        gate, _ = gates.gate_rule(call)
        rnd = round_open(
            call=call,
            input_requests={"environment": _form("Pick the environment")},
            raw={"resultType": "input_required"},
            request_state=None,
            received_at=timezone.now(),
        )

    assert gate is not None and gate.name == "deployer gate"
    assert rnd.input_requests.get().rule.name == "deployer forms"
    reads = [q["sql"] for q in queries if 'FROM "approvals_routingrule"' in q["sql"]]
    assert len(reads) == 2, reads
    for sql in reads:
        for column in McpServer.STORED_JSON:
            assert f'"approvals_mcpserver"."{column}"' not in sql, (column, sql)


def test_an_argument_shown_in_the_routing_explanation_is_shortened_whatever_its_size() -> None:
    """Each rule checked leaves a line in every request's stored explanation, quoting the argument it looked
    at. An agent's argument may be as large as a body allows (a 300 KB note here): quoted whole, it was copied
    once per rule per request (each round request, every rule on it: 10 rules x 5 questions stored 15 MB).
    The explanation quotes a short head of it instead, enough to see why the rule did not match."""
    release = factories.team("release")
    server = McpServer.objects.create(slug="deployer", name="Deployer", url="https://deployer.example/mcp")
    note = "n" * 300_000
    for position in range(10):
        RoutingRule.objects.create(
            position=position,
            name=f"rule {position}",
            team=release,
            conditions=[{"argument": "details.note", "op": "==", "value": f"wanted {position}"}],
        )
    RoutingRule.objects.create(
        position=50,
        name="big notes",
        team=release,
        conditions=[{"argument": "details.note", "op": "in", "value": [note, "other"]}],
    )
    call = factories.call(server, arguments={"branch": "main", "details": {"note": note}})

    with transaction.atomic():
        rnd = round_open(
            call=call,
            input_requests={f"question{i}": _form(f"Question {i}") for i in range(5)},
            raw={"resultType": "input_required"},
            request_state=None,
            received_at=timezone.now(),
        )

    stored = list(rnd.input_requests.values_list("routing", flat=True))
    assert len(stored) == 5
    for routing in stored:
        assert routing["matched"] == "big notes"  # the rule still compares the whole value
        assert len(json.dumps(routing)) < 16_000, len(json.dumps(routing))
        first = routing["checked"][0]
        assert first["matched"] is False
        assert first["why"].startswith("details.note is 'nnnn")
        assert "not == 'wanted 0'" in first["why"]
        assert "..." in first["why"]
