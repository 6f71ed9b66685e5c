"""A gate's page and its second look read the tool as the approval is bound to it (the definition the hub
held when the gate opened, in its digest), not the server's list as it stands now: a list that changed
meanwhile must not make the page contradict itself, nor spare a destructive tool its second look."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import AuditEvent, InputRequest, Membership, RoutingRule
from approvals.services import calls
from tests import factories

pytestmark = pytest.mark.django_db

SCALE = {
    "name": "scale",
    "inputSchema": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
}


def _list(server: Any, annotations: dict[str, Any]) -> None:
    server.tools = [{**SCALE, "annotations": annotations}]
    server.tools_fetched_at = timezone.now()
    server.save()


@pytest.fixture
def gated(client: Client) -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    _list(deploy, {"destructiveHint": True})
    RoutingRule.objects.create(name="scaling", server=deploy, tool_pattern="scale", gate=True, team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    call, _ = calls.call_submit(agent=agent, server_slug="deploy", tool="scale", arguments={"replicas": 2})
    client.force_login(alice)
    # The server's list changes after the gate opened: now it says the tool only reads.
    _list(deploy, {"readOnlyHint": True, "destructiveHint": False})
    return SimpleNamespace(call=call, gate=InputRequest.objects.get(round__call=call, key="gate"))


def test_the_gate_page_says_what_the_bound_definition_claims(client: Client, gated: Any) -> None:
    page = client.get(f"/requests/{gated.gate.pk}/").text
    claims = page[page.index("data-tool-claims") : page.index("</p>", page.index("data-tool-claims"))]
    assert "may make destructive changes" in claims
    assert "only reads" not in claims
    assert "You will be shown the arguments once more" in page


def test_approving_the_bound_destructive_tool_takes_a_second_look(client: Client, gated: Any) -> None:
    first = client.post(f"/requests/{gated.gate.pk}/decide/", {"decision": "approve"})
    assert first.status_code == 200
    assert "may make destructive changes" in first.text
    assert not AuditEvent.objects.filter(call_id=gated.call.pk, verb="gate.approved").exists()
    done = client.post(f"/requests/{gated.gate.pk}/decide/", factories.second_look_fields(first.text))
    assert done.status_code == 302
    assert AuditEvent.objects.filter(call_id=gated.call.pk, verb="gate.approved").count() == 1
