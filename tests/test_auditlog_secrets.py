"""Secrets never reach the audit log, whatever shape the data that carries them has."""

from __future__ import annotations

import pytest

from approvals.audit import core as audit
from approvals.audit.core import REDACTED, Actor
from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db


def test_a_secret_named_in_a_name_value_pair_is_redacted() -> None:
    """A deploy tool's environment as Kubernetes writes it, and headers as a list: the secret's name is data,
    its value sits under "value"."""
    arguments = {
        "env": [
            {"name": "DB_PASSWORD", "value": "hunter2"},
            {"name": "LOG_LEVEL", "value": "debug"},
        ],
        "fields": [{"Name": "X-Api-Key", "Value": "k-123"}, {"key": "Accept", "value": "text/plain"}],
        "tags": [{"Key": "session_token", "Value": "abc"}],
    }
    event = audit.record(
        actor=Actor.system(),
        verb="call.submitted",
        call=factories.call(factories.server("deploy")),
        data={"tool": "deploy", "arguments": arguments},
    )
    stored = AuditEvent.objects.get(pk=event.pk).data["arguments"]
    assert stored["env"] == [
        {"name": "DB_PASSWORD", "value": REDACTED},
        {"name": "LOG_LEVEL", "value": "debug"},
    ]
    assert stored["fields"] == [
        {"Name": "X-Api-Key", "Value": REDACTED},
        {"key": "Accept", "value": "text/plain"},
    ]
    assert stored["tags"] == [{"Key": "session_token", "Value": REDACTED}]
    assert "hunter2" not in str(AuditEvent.objects.get(pk=event.pk).data)
    assert audit.verify().ok
