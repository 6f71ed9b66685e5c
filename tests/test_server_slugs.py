"""A server's slug names its tools on the gateway's `/mcp` as `<slug>__<tool>`, so a new slug may not hold
`__` nor end in `_` (the first `__` of a name then ends the slug): refused alike by the model, the admin and
`manage.py add_server`. A server registered before the rule keeps its slug and can still be edited."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from approvals.models import McpServer
from tests.test_long_tools import http_form

pytestmark = pytest.mark.django_db

REFUSED = ["a__b", "deploy__", "a_", "x___y"]


@pytest.mark.parametrize("slug", REFUSED)
def test_a_slug_the_gateway_could_not_split_is_refused_everywhere(slug: str, admin_client: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        McpServer(slug=slug, name="x", url="http://127.0.0.1:9/mcp").full_clean()
    assert "slug" in raised.value.message_dict

    page = admin_client.post("/admin/approvals/mcpserver/add/", http_form(slug=slug))
    assert page.status_code == 200 and "may not contain" in page.content.decode()

    with pytest.raises(CommandError, match="may not contain"):
        call_command("add_server", slug, "http://127.0.0.1:9/mcp", "--no-probe", stdout=io.StringIO())
    assert not McpServer.objects.exists()


def test_a_server_registered_before_the_rule_keeps_its_slug_but_cannot_take_another(
    admin_client: Any,
) -> None:
    legacy = McpServer.objects.create(slug="old__one", name="Old", url="http://127.0.0.1:9/mcp")
    legacy.full_clean()  # unchanged: still valid
    call_command("add_server", "old__one", "http://127.0.0.1:9/v2", "--no-probe", stdout=io.StringIO())
    assert McpServer.objects.get(pk=legacy.pk).url == "http://127.0.0.1:9/v2"
    page = admin_client.post(
        f"/admin/approvals/mcpserver/{legacy.pk}/change/", http_form(slug="old__one", name="Old, renamed")
    )
    assert page.status_code == 302, page.content.decode()[:2000]
    assert McpServer.objects.get(pk=legacy.pk).name == "Old, renamed"
    legacy.slug = "other__one"
    with pytest.raises(ValidationError):
        legacy.full_clean()
    # Single underscores and hyphens stay allowed, within a slug and at its start.
    for slug in ["a_b", "deploy-bot", "_private", "a-_b"]:
        call_command("add_server", slug, "http://127.0.0.1:9/mcp", "--no-probe", stdout=io.StringIO())
        McpServer.objects.get(slug=slug).full_clean()
