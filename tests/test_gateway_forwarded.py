"""The gateway counts a request without a valid agent token against the anonymous limit per client address,
as the REST API does; behind a proxy (ELICIT_NUM_PROXIES=1) that is the address the proxy added. A client may
send its own ``X-Forwarded-For`` line before the proxy's (HAProxy's ``option forwardfor`` adds a line of its
own): every line counts, joined in order as Django joins them, so a forged first line changes nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import secrets

import ninja.conf
import pytest
from asgiref.sync import async_to_sync

from approvals.gateway.server import build_app

pytestmark = pytest.mark.django_db


def _post(headers: list[tuple[bytes, bytes]]) -> int:
    """A POST to /mcp through the gateway's own app, from the proxy's address; its status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    received: list[bool] = []

    async def receive() -> dict:
        if not received:
            received.append(True)
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    async_to_sync(build_app())(scope, receive, send)
    return next(m for m in sent if m["type"] == "http.response.start")["status"]


def test_a_forged_forwarded_for_line_before_the_proxys_does_not_make_a_new_client(
    settings, monkeypatch
) -> None:
    monkeypatch.setattr(ninja.conf.settings, "NUM_PROXIES", 1)
    settings.ELICIT_API_ANON_RATE = "2/m"
    # One client of the proxy's (an address of this run's own, so no earlier run's count is met).
    client = str(ipaddress.IPv4Address(0xC6336400 + secrets.randbelow(250) + 1))  # 198.51.100.0/24
    statuses = [
        _post([(b"x-forwarded-for", f"203.0.113.{i}".encode()), (b"x-forwarded-for", client.encode())])
        for i in range(3)
    ]
    assert statuses == [401, 401, 429]
