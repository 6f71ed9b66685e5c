"""Hostile input in the admin's forms is a field error, never a server error: a server's per-tool limits
that PostgreSQL could not store (NUL, a lone surrogate) or Python could not even parse (nesting past its
recursion limit)."""

from __future__ import annotations

import sys

import pytest
from django.test import Client

from approvals.models import McpServer

pytestmark = pytest.mark.django_db


def stdio_form(**extra: str) -> dict[str, str]:
    return {
        "slug": "local-tools",
        "name": "Local tools",
        "transport": "stdio",
        "url": "",
        "command": sys.executable,
        "arguments": "-m\nmy_server\n",
        "enabled": "on",
        "on_expiry": "",
    } | extra


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ('{"build\\u0000": 60}', "cannot be stored"),
        ('{"build\\ud800": 60}', "cannot be stored"),
        ("[" * 60_000, "cannot be stored"),
        ('{"build": NaN}', "cannot be stored"),
        ("{build: 60}", "Enter a valid JSON"),
        ("x" * 70_000, "characters of JSON"),
    ],
)
def test_per_tool_limits_that_cannot_be_stored_are_a_field_error(
    admin_client: Client, typed: str, said: str
) -> None:
    page = admin_client.post("/admin/approvals/mcpserver/add/", stdio_form(tool_timeouts=typed))

    assert page.status_code == 200
    assert said in page.text
    assert not McpServer.objects.exists()


def test_per_tool_limits_as_typed_are_stored(admin_client: Client) -> None:
    page = admin_client.post("/admin/approvals/mcpserver/add/", stdio_form(tool_timeouts='{"build": 1800}'))

    assert page.status_code == 302
    assert McpServer.objects.get().tool_timeouts == {"build": 1800}
