"""Registering and editing MCP servers in the admin: what a save holds while it probes the server, and
what happens to the stored credentials and tool list when the server's address changes."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from django.test import Client

from approvals.audit import core as audit
from approvals.models import McpServer
from tests import factories, live


class LockWitness:
    """An HTTP "MCP server" that, before answering each request (404), looks from its own database
    connection at what the hub holds while it waits for the answer: whether the audit chain's lock and the
    server's row can be taken. The hub waits on it, so what it sees is what a probe holds."""

    def __init__(self, server_pk: int) -> None:
        self.server_pk = server_pk
        self.seen: list[dict[str, bool]] = []
        self.headers: list[dict[str, str]] = []
        witness = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                witness.headers.append(dict(self.headers))
                witness.seen.append(witness.look())
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_DELETE = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/mcp"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def look(self) -> dict[str, bool]:
        with psycopg.connect(live.test_database_url()) as db:
            chain = db.execute("SELECT pg_try_advisory_xact_lock(%s)", [audit._CHAIN_LOCK]).fetchone()
            db.rollback()
            row = db.execute(
                "SELECT id FROM approvals_mcpserver WHERE id = %s FOR UPDATE SKIP LOCKED", [self.server_pk]
            ).fetchall()
            db.rollback()
        return {"audit_chain_free": bool(chain and chain[0]), "server_row_free": bool(row)}

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


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


@pytest.fixture
def root(live_db: None) -> Client:
    client = Client()
    client.force_login(factories.user("root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def witness(live_db: None) -> Iterator[LockWitness]:
    server = factories.server("deploy")
    found = LockWitness(server.pk)
    yield found
    found.stop()


def test_saving_a_server_in_the_admin_probes_it_without_holding_the_audit_chain_or_its_row(
    root: Client, witness: LockWitness
) -> None:
    server = McpServer.objects.get(slug="deploy")
    response = root.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(witness.url))
    assert response.status_code == 302
    assert witness.seen, "the save probed the server"
    # While a slow server keeps the probe waiting, every other audit write of the hub (and the server's
    # calls) must go on: the probe holds neither the chain's lock nor the server's row.
    assert witness.seen == [{"audit_chain_free": True, "server_row_free": True}] * len(witness.seen)
    server.refresh_from_db()
    assert server.url == witness.url and server.probe is not None and server.probe["ok"] is False


SECRET = "Bearer sk-live-71c3e9a0d5"


@pytest.mark.parametrize("elsewhere", ["http://localhost:{port}/mcp", "http://127.0.0.1:{other}/mcp"])
def test_pointing_a_server_elsewhere_in_the_admin_does_not_send_its_stored_credentials_there(
    elsewhere: str, root: Client, witness: LockWitness
) -> None:
    server = McpServer.objects.get(slug="deploy")
    McpServer.objects.filter(pk=server.pk).update(headers={"Authorization": SECRET})
    port = witness.url.split(":")[2].split("/")[0]
    url = elsewhere.format(port=port, other=int(port) + 1)
    if "localhost" in url:  # another host, the same listener: what reaches it is seen
        response = root.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(url))
        assert response.status_code == 200, [seen.get("Authorization") for seen in witness.headers]
        page = response.content.decode()
        assert "credentials were set for http://127.0.0.1:9;" in page and SECRET not in page
        assert not witness.headers
        assert McpServer.objects.get(pk=server.pk).url == server.url
    # Set again (or removed) with the new address, they go there.
    form = server_form(url, new_headers="Authorization: Bearer new")
    assert root.post(f"/admin/approvals/mcpserver/{server.pk}/change/", form).status_code == 302
    server.refresh_from_db()
    assert server.url == url and server.headers == {"Authorization": "Bearer new"}
    assert all(seen.get("Authorization") != SECRET for seen in witness.headers)


def test_moving_a_server_on_the_same_origin_keeps_its_credentials(root: Client, witness: LockWitness) -> None:
    server = McpServer.objects.get(slug="deploy")
    McpServer.objects.filter(pk=server.pk).update(url=witness.url, headers={"Authorization": SECRET})
    url = witness.url.replace("/mcp", "/v2/mcp")
    assert root.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(url)).status_code == 302
    assert McpServer.objects.get(pk=server.pk).headers == {"Authorization": SECRET}
    assert witness.headers and witness.headers[0].get("Authorization") == SECRET


def closed_url() -> str:
    return f"http://127.0.0.1:{live.free_port()}/mcp"


LEARNED_AT_THE_OLD_ADDRESS = {
    "tools": [{"name": "wipe", "annotations": {"readOnlyHint": True}}],
    "discover": {"supportedVersions": ["2026-07-28"], "capabilities": {}},
    "probe": {"ok": True, "era": "2026-07-28", "tool_count": 1},
}


@pytest.mark.django_db
def test_a_server_moved_to_an_unreachable_address_keeps_nothing_learned_at_the_old_one(
    admin_client: Client,
) -> None:
    server = factories.server("deploy", **LEARNED_AT_THE_OLD_ADDRESS)
    url = closed_url()
    response = admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(url))
    assert response.status_code == 302
    server.refresh_from_db()
    # The old address's tool definitions (which routing, grants and approvals read) and era are gone.
    assert server.url == url and server.tools is None and server.discover is None
    assert server.probe["error"]["code"] == "connect_failed"
    # Saved again at the same address, a failed probe keeps what a good one stored.
    McpServer.objects.filter(pk=server.pk).update(tools=[{"name": "kept"}])
    admin_client.post(f"/admin/approvals/mcpserver/{server.pk}/change/", server_form(url, name="Renamed"))
    assert McpServer.objects.get(pk=server.pk).tools == [{"name": "kept"}]


@pytest.mark.django_db
def test_add_server_moving_a_server_forgets_what_it_learned_at_the_old_address() -> None:
    from django.core.management import call_command

    server = factories.server("deploy", **LEARNED_AT_THE_OLD_ADDRESS)
    call_command("add_server", "deploy", server.url, "--no-probe", stdout=io.StringIO())
    assert McpServer.objects.get(pk=server.pk).tools == LEARNED_AT_THE_OLD_ADDRESS["tools"]
    call_command("add_server", "deploy", closed_url(), "--no-probe", stdout=io.StringIO())
    server.refresh_from_db()
    assert server.tools is None and server.discover is None and server.probe is None
