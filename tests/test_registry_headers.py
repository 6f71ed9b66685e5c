"""Credentials (headers) given to a server in the admin or with `add_server`: only what HTTP can carry is
stored, a bad line is refused with a clear error that never repeats the secret, and a server stored with
headers from before is still probed to an answer rather than a crash."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from approvals.models import AuditEvent, McpServer
from approvals.services import servers
from tests import factories

pytestmark = pytest.mark.django_db

SECRET = "sk-live-4c9d2e7f1a"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


BAD_LINES = [
    (f"Authorization: Bearer {SECRET}ø", "printable ASCII"),  # an accent HTTP cannot carry
    (f"Authorization: Bearer {SECRET}\x07", "printable ASCII"),  # a control character
    (f"Bad Name: {SECRET}", "header name"),  # a space in the name
    (f"Bearer {SECRET}", "Name: value"),  # the token pasted alone
]


@pytest.mark.parametrize(("line", "says"), BAD_LINES)
def test_add_server_refuses_a_header_http_cannot_send_without_repeating_it(line: str, says: str) -> None:
    with pytest.raises(CommandError) as info:
        run("add_server", "deploy", "http://127.0.0.1:9/mcp", "--header", line, "--no-probe")
    assert says in str(info.value) and SECRET not in str(info.value)
    assert not McpServer.objects.exists()


@pytest.mark.parametrize(("line", "says"), BAD_LINES)
def test_the_admin_refuses_a_header_http_cannot_send_with_a_form_error(
    line: str, says: str, admin_client: Client
) -> None:
    server = factories.server("deploy", headers={"Authorization": "Bearer old"})
    form = {
        "slug": "deploy", "name": "Deploy", "transport": "http", "url": server.url, "era": "auto",
        "enabled": "on", "on_expiry": "", "new_headers": f"X-Team: blue\n{line}",
    }  # fmt: skip
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", form)
    assert response.status_code == 200  # the form again, with its error; not a server error
    page = response.content.decode()
    assert says in page.replace("“", '"').replace("”", '"') and SECRET not in page
    assert McpServer.objects.get(pk=server.pk).headers == {"Authorization": "Bearer old"}


def test_a_header_given_twice_is_refused_and_a_good_set_is_kept() -> None:
    with pytest.raises(CommandError, match="twice"):
        run("add_server", "deploy", "http://127.0.0.1:9/mcp", "--header", "X-Key: a", "--header", "x-key: b")
    run("add_server", "deploy", "http://127.0.0.1:9/mcp", "--header", "X-Key:\ta b", "--no-probe")
    assert McpServer.objects.get().headers == {"X-Key": "a b"}


def test_a_server_stored_with_a_header_http_cannot_send_is_probed_to_an_error_not_a_crash() -> None:
    server = factories.server("legacy", headers={"Authorization": f"Bearer {SECRET}ø"})
    found = servers.server_probe(server)
    assert found["ok"] is False and found["error"]["code"] == "invalid_headers"
    assert "credentials" in found["hint"]
    event = AuditEvent.objects.filter(verb="server.probed").latest("id")
    assert SECRET not in json.dumps(found) and SECRET not in json.dumps(event.data)
