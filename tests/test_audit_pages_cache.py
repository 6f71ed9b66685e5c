"""The audit pages show what an auditor may see now: a browser never keeps them, so Back after signing out,
or after the history moved on, reads them again instead of showing a stale copy."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.audit import core as audit
from approvals.audit.core import Actor
from tests import factories


@pytest.mark.django_db
def test_the_audit_pages_are_not_kept_by_the_browser(client: Client) -> None:
    call = factories.call(factories.server())
    audit.record(actor=Actor.system(), verb="call.submitted", call=call, data={"tool": call.tool})
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    for url in ("/audit/", "/audit/newer/?after=0", f"/audit/calls/{call.pk}/", "/audit/head.json"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert "no-store" in response["Cache-Control"], url
