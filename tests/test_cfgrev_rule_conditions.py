"""A rule's conditions typed in the admin are parsed as JSON from outside is: what PostgreSQL or the hub's
recursion cannot hold (NUL, NaN, nesting thousands deep) or too much of it is a clear field error on the
form, not a server error, and nothing is saved. Conditions that can be stored still save as before."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from approvals.models import AuditEvent, RoutingRule
from tests import factories

pytestmark = pytest.mark.django_db

ADD = "/admin/approvals/routingrule/add/"


def form(conditions: str, **extra: str) -> dict[str, str]:
    """The admin's add-rule form, posted with these conditions (JSON text) and any field of `extra`."""
    return {
        "position": "10",
        "name": "Production deploys",
        "enabled": "on",
        "server": "",
        "tool_pattern": "*",
        "mode": "",
        "destructive": "unknown",
        "read_only": "unknown",
        "open_world": "unknown",
        "conditions": conditions,
        "team": str(factories.team("release").pk),
        "policy": "",
        "answered_by": "team",
        **extra,
    }


@pytest.mark.parametrize(
    ("conditions", "error"),
    [
        ('[{"argument": "env", "op": "==", "value": ' + "[" * 5000 + "]" * 5000 + "}]", "nesting deeper"),
        ('[{"argument": "env\\u0000", "op": "exists"}]', "NUL"),
        ('[{"argument": "count", "op": "==", "value": NaN}]', "not a JSON number"),
        ('[{"argument": "env", "op": "==", "value": "' + "x" * 70_000 + '"}]', "at most 65536 characters"),
        ("[{", "Enter a valid JSON"),
    ],
)
def test_conditions_that_cannot_be_stored_are_a_field_error(admin_client: Client, conditions, error) -> None:
    page = admin_client.post(ADD, form(conditions))
    assert page.status_code == 200
    assert error in page.text
    assert not RoutingRule.objects.exists()
    assert not AuditEvent.objects.filter(verb="rule.created").exists()


def test_conditions_that_can_be_stored_save_and_are_audited(admin_client: Client) -> None:
    wanted = [{"argument": "target.environment", "op": "in", "value": ["production", {"a": [1, True]}]}]
    page = admin_client.post(ADD, form(json.dumps(wanted)))
    assert page.status_code == 302, page.text[:2000]
    assert RoutingRule.objects.get().conditions == wanted
    assert AuditEvent.objects.filter(verb="rule.created").count() == 1
