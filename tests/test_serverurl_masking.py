"""A server URL may carry a credential (``?api_key=...``, as hosted MCP servers ask, or ``user:password@``):
it reaches no page, printout, repr or audit event whole. Each shows it as `urlsafety.shown` gives it; the
admin keeps the stored address when it is left as shown, and the audit still tells when its hidden part
changed."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from approvals import urlsafety
from approvals.models import AuditEvent, McpServer
from tests import factories, live

pytestmark = pytest.mark.django_db

KEY = "sk-live-4f7a9c2e81d3b6"


def closed(query: str = f"api_key={KEY}") -> str:
    """A URL no server answers (the probe fails at once), holding `query`."""
    return f"http://127.0.0.1:{live.free_port()}/mcp?{query}"


def in_audit_log(text: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM approvals_auditevent e WHERE row_to_json(e)::text ILIKE %s", [f"%{text}%"]
        )
        return int(cursor.fetchone()[0])


def server_form(url: str, **extra: str) -> dict[str, str]:
    return {
        "slug": "deploy",
        "name": "Deploy server",
        "transport": "http",
        "url": url,
        "era": "auto",
        "enabled": "on",
        "on_expiry": "",
    } | extra


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://mcp.example.com/mcp?api_key=sk-1&v=2", "https://mcp.example.com/mcp?api_key=***&v=***"),
        ("https://alice:s3cret@mcp.example.com:8443/mcp", "https://alice:***@mcp.example.com:8443/mcp"),
        ("https://ghp_token@mcp.example.com/mcp", "https://***@mcp.example.com/mcp"),
        ("https://mcp.example.com/mcp?sk-bare-token#frag", "https://mcp.example.com/mcp?***#***"),
        ("http://127.0.0.1:9/mcp", "http://127.0.0.1:9/mcp"),
        # A key in the path, as hosted servers give each user a URL of their own: a token, a UUID.
        (
            "https://mcp.example.com/api/mcp/s/NjM1ZTVhNDEtYjQ4Zi00ZDVj/mcp",
            "https://mcp.example.com/api/mcp/s/***/mcp",
        ),
        (
            "https://mcp.example.net/0b5d6e0f-0c1b-4cde-8a2e-5f0e1e2d3c4b/github?k=v",
            "https://mcp.example.net/***/github?k=***",
        ),
        # Words, versions and short ids stay: they name the server, not a key.
        (
            "https://mcp.example.com/v2/release-managers-deployments/mcp",
            "https://mcp.example.com/v2/release-managers-deployments/mcp",
        ),
        (
            "https://mcp.example.com/api/2026-07-28/tenant42/mcp",
            "https://mcp.example.com/api/2026-07-28/tenant42/mcp",
        ),
        ("https://mcp.example.com:99999/mcp?k=v", "***"),  # unreadable: nothing of it
        ("", ""),
    ],
)
def test_a_server_url_is_shown_with_its_query_values_and_password_hidden(url: str, expected: str) -> None:
    assert urlsafety.shown(url) == expected
    assert urlsafety.shown(expected) == expected  # shown twice, the same


def test_the_admin_list_and_form_show_the_url_without_its_credentials(admin_client: Client) -> None:
    server = factories.server("deploy", url=closed())
    factories.server("legacy", url="https://bob:hunter2-pass@127.0.0.1:9/mcp")
    listing = admin_client.get("/admin/approvals/mcpserver/").content.decode()
    form = admin_client.get(f"/admin/approvals/mcpserver/{server.pk}/change/").content.decode()
    for page in (listing, form):
        assert KEY not in page and "hunter2" not in page
    assert "/mcp?api_key=***" in listing and "https://bob:***@127.0.0.1:9/mcp" in listing
    assert "/mcp?api_key=***" in form


def test_an_admin_edit_leaving_the_url_as_shown_keeps_it_and_what_was_learned_there(
    admin_client: Client,
) -> None:
    url = closed()
    tools = [{"name": "deploy", "inputSchema": {"type": "object"}}]
    server = factories.server("deploy", url=url, tools=tools)
    form = server_form(urlsafety.shown(url), name="Renamed")
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[-3000:]
    server.refresh_from_db()
    assert (server.name, server.url, server.tools) == ("Renamed", url, tools)
    [event] = AuditEvent.objects.filter(verb="server.changed")
    assert [change["field"] for change in event.data["changes"]] == ["name"]


def test_an_admin_edit_cannot_carry_hidden_values_to_an_edited_address(admin_client: Client) -> None:
    url = closed()
    server = factories.server("deploy", url=url)
    elsewhere = urlsafety.shown(url).replace("/mcp?", "/v2/mcp?")
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(elsewhere))
    assert response.status_code == 200
    page = response.content.decode()
    assert "type the whole address again" in page and KEY not in page
    assert McpServer.objects.get(pk=server.pk).url == url


def test_an_admin_edit_cannot_carry_a_hidden_path_key_to_an_edited_address(admin_client: Client) -> None:
    path_key = "NjM1ZTVhNDEtYjQ4Zi00ZDVjLWI1N2Y"
    url = f"http://127.0.0.1:{live.free_port()}/s/{path_key}/mcp"
    server = factories.server("deploy", url=url)
    form = admin_client.get(f"/admin/approvals/mcpserver/{server.pk}/change/").content.decode()
    assert path_key not in form and "/s/***/mcp" in form
    edited = urlsafety.shown(url) + "?region=eu"
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(edited))
    assert response.status_code == 200
    page = response.content.decode()
    assert "type the whole address again" in page and path_key not in page
    assert McpServer.objects.get(pk=server.pk).url == url
    # Left as shown, the stored address (its key included) stays.
    response = admin_client.post(
        f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(urlsafety.shown(url), name="Renamed")
    )
    assert response.status_code == 302
    assert McpServer.objects.get(pk=server.pk).url == url
    assert in_audit_log(path_key) == 0


def test_a_new_url_typed_in_the_admin_is_stored_audited_as_changed_and_never_echoed(
    admin_client: Client,
) -> None:
    url = closed()
    server = factories.server("deploy", url=url)
    # The same address but for its key: only the hidden part changed.
    new_key = "sk-live-0a1b2c3d4e5f67"
    moved = url.replace(KEY, new_key)
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(moved))
    assert response.status_code == 302
    assert McpServer.objects.get(pk=server.pk).url == moved
    [event] = AuditEvent.objects.filter(verb="server.changed")
    [change] = [change for change in event.data["changes"] if change["field"] == "url"]
    shown = urlsafety.shown(url)
    assert change == {"field": "url", "old": shown, "new": shown, "hidden": "changed"}
    assert "hidden part changed" in event.data["message"]
    # With errors, the form gives back what was typed only as shown.
    page = admin_client.post(
        f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(url, round_ttl="x")
    ).content.decode()
    assert KEY not in page and new_key not in page
    assert in_audit_log(KEY) == 0 and in_audit_log(new_key) == 0


def test_a_server_deleted_in_the_admin_is_audited_without_its_url_credentials(admin_client: Client) -> None:
    server = factories.server("deploy", url=closed())
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    [event] = AuditEvent.objects.filter(verb="server.deleted")
    [change] = [change for change in event.data["changes"] if change["field"] == "url"]
    assert change["old"].endswith("/mcp?api_key=***") and change["hidden"] == "cleared"
    assert in_audit_log(KEY) == 0


def test_a_user_who_may_only_view_servers_sees_the_url_as_shown() -> None:
    server = factories.server("deploy", url=closed())
    viewer = factories.user("vera", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_mcpserver"))
    client = Client()
    client.force_login(viewer)
    page = client.get(f"/admin/approvals/mcpserver/{server.pk}/change/")
    assert page.status_code == 200
    content = page.content.decode()
    assert KEY not in content and "/mcp?api_key=***" in content


def test_the_admin_search_is_no_oracle_on_a_urls_hidden_values(admin_client: Client) -> None:
    factories.server("deploy", url=closed())

    def found(query: str) -> int:
        return int(admin_client.get("/admin/approvals/mcpserver/", {"q": query}).context["cl"].result_count)

    assert found("api_key=sk-live-4") == 0  # letter by letter, a search would spell the key
    assert found("deploy") == 1


def test_add_server_and_check_server_print_and_audit_the_url_without_its_credentials() -> None:
    url = closed()
    out = run("add_server", "deploy", url, "--no-probe")
    assert KEY not in out and "/mcp?api_key=***" in out
    with pytest.raises(CommandError):
        call_command("check_server", "deploy", stdout=(printed := io.StringIO()), stderr=io.StringIO())
    assert KEY not in printed.getvalue() and "/mcp?api_key=***" in printed.getvalue()
    [event] = AuditEvent.objects.filter(verb="server.created")
    [change] = [change for change in event.data["changes"] if change["field"] == "url"]
    assert change == {"field": "url", "old": None, "new": urlsafety.shown(url), "hidden": "set"}
    # Registered again with another key: the change is recorded, the key is not.
    run("add_server", "deploy", url.replace(KEY, "sk-live-99887766554433"), "--no-probe")
    [event] = AuditEvent.objects.filter(verb="server.changed")
    assert event.data["changes"][0]["hidden"] == "changed"
    assert in_audit_log(KEY) == 0 and in_audit_log("sk-live-99887766554433") == 0


def test_add_server_refusing_a_url_does_not_print_its_credentials() -> None:
    with pytest.raises(CommandError) as info:
        run("add_server", "deploy", f"http://127.0.0.1:9/mcp?api_key={KEY}&x=a b", "--no-probe")
    assert KEY not in str(info.value) and "api_key=***" in str(info.value)


def test_a_servers_repr_holds_no_credential() -> None:
    server = factories.server("deploy", url=closed())
    assert KEY not in repr(server) and "deploy" in repr(server)
