"""The message shown after saving a server quotes what its probe found as the server list does: the
server's own name, as it says it, with each character that is not printable as a visible code, so that a
name holding a direction override or a line break cannot make the message read as something else.

Against a real server built on the official SDK (this file run as a script: ``python THIS_FILE PORT``)
whose name holds a right-to-left override."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

NAME = "calm\u202e\nok: era modern, 0 tool(s)"


def _serve(port: int) -> None:
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from starlette.responses import JSONResponse

    mcp = MCPServer(NAME, version="1.0.0")

    @mcp.tool(description="Looks a name up")
    def lookup(query: str) -> str:
        return f"found {query}"

    app = mcp.streamable_http_app(json_response=True, stateless_http=True)

    async def ready(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/_ready":
            await JSONResponse({"ok": True})(scope, receive, send)
            return
        await app(scope, receive, send)

    uvicorn.run(ready, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
    sys.exit(0)


from django.contrib.messages import get_messages  # noqa: E402
from django.test import Client  # noqa: E402

from approvals.models import McpServer  # noqa: E402
from tests.live import script_mcp_url  # noqa: E402


@pytest.fixture(scope="module")
def named_url() -> Iterator[str]:
    with script_mcp_url(Path(__file__), "the server with a hostile name") as url:
        yield url


@pytest.mark.django_db
def test_the_probe_message_after_saving_a_server_shows_its_name_as_the_list_does(
    admin_client: Client, named_url: str
) -> None:
    form = {"slug": "named", "name": "Named", "transport": "http", "url": named_url, "enabled": "on"}

    page = admin_client.post("/admin/approvals/mcpserver/add/", form)

    assert page.status_code == 302, page.text
    found = McpServer.objects.get().probe or {}
    assert found["server_info"]["name"] == NAME
    said = [str(message) for message in get_messages(page.wsgi_request)]
    assert len(said) == 2  # the probe's, then Django's "was added successfully"
    probe = said[0]
    assert "\u202e" not in probe and "\n" not in probe
    assert "calm\u27e8U+202E\u27e9\u27e8U+000A\u27e9ok: era modern" in probe
