"""An export of the audit log is the log itself: no browser or proxy keeps a copy of it, as of the pages."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit.core import Actor
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_an_export_is_not_kept_by_the_browser(client: Client, fmt: str) -> None:
    audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"message": "kept nowhere"})
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    response = client.get(reverse("audit:export", args=[fmt]))
    assert response.status_code == 200
    assert b"kept nowhere" in b"".join(response.streaming_content)
    assert "no-store" in response["Cache-Control"]
    assert "private" in response["Cache-Control"]
