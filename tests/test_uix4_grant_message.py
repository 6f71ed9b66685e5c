"""The confirmation after revoking a grant names the agent and the tool as every page does: a tool name's
direction-changing and invisible characters are shown as codes, not obeyed."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import Membership
from approvals.services import grants
from tests import factories

pytestmark = pytest.mark.django_db


def test_the_revoke_confirmation_shows_a_tool_name_s_bidi_override_as_a_code() -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", default_team=release)
    agent, _ = factories.agent("ci-bot", servers=[deploy])
    call = factories.call(deploy, agent, tool="push_\u202egnp.exe<b>")
    grant = grants.create_from_approval(
        approver=alice, call=call, tool_digest="d" * 64, choice={"for": "8h", "arguments": "exact"}
    )
    client = Client()
    client.force_login(alice)
    response = client.post(f"/grants/{grant.pk}/revoke/", follow=True)
    page = response.content.decode()
    start = page.index('<ul class="messages">')
    message = page[start : page.index("</ul>", start)]
    assert "Revoked the grant" in message
    assert "\u202e" not in message
    assert "U+202E" in message
    assert "<b>" not in message and "&lt;b&gt;" in message
