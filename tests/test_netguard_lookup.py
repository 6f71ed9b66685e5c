"""A name's lookup is bounded by the request's timeout: the system's resolver, with a name server that does
not answer, retries for tens of seconds, and a webhook or chat notice held its worker that long whatever
its timeout said. The resolver here is a stub that takes longer than the timeout before answering with a
real listener's address, so without the bound the request succeeds, late."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from approvals import netguard
from approvals.models import ToolCall
from tests import factories
from tests.hub import Agent


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _slow(seconds: float) -> netguard.Resolver:
    def resolve(host: str, port: int) -> list[str]:
        time.sleep(seconds)
        return ["127.0.0.1"]

    return resolve


def test_a_lookup_slower_than_the_timeout_is_refused_as_transient_in_time(
    listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netguard, "resolver", _slow(3.0))
    allow = netguard.Allow.parse("127.0.0.0/8")
    monkeypatch.setattr(netguard, "configured", lambda: allow)
    started = time.monotonic()
    with pytest.raises(netguard.OutboundRefused, match="did not resolve in time") as refused:
        netguard.post(f"http://hooks.example.test:{listener}/in", timeout=0.5, json={"ok": True})
    assert time.monotonic() - started < 2.0
    assert refused.value.transient  # retried later, as any lookup failure is


def test_a_lookup_within_the_timeout_goes_through(listener: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netguard, "resolver", _slow(0.05))
    allow = netguard.Allow.parse("127.0.0.0/8")
    monkeypatch.setattr(netguard, "configured", lambda: allow)
    response = netguard.post(f"http://hooks.example.test:{listener}/in", timeout=2.0, json={"ok": True})
    assert response.status_code == 200


def test_without_a_timeout_the_check_waits_for_the_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The async guard (`acheck_url`) runs the whole check on a resolver thread and bounds the wait there."""
    checked = netguard.check_url(
        "http://hooks.example.test/in", allow=netguard.Allow.parse("127.0.0.0/8"), resolve=_slow(0.3)
    )
    assert checked.addresses == ("127.0.0.1",)


@pytest.mark.django_db
def test_a_callback_whose_name_resolves_slowly_is_refused_at_submit_in_time(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent names its callback's host, so its name server decides how long the lookup at submit takes:
    it held the API request as long as the system's resolver retried. Now ELICIT_WEBHOOK_TIMEOUT at most."""
    settings.ELICIT_WEBHOOK_TIMEOUT = 0.5
    monkeypatch.setattr(netguard, "resolver", _slow(3.0))
    _, token = factories.agent("ci-bot", servers=[factories.server("deploy")])
    started = time.monotonic()
    response = Agent(token).post(
        "/calls", {"server": "deploy", "tool": "x", "callback_url": "https://hooks.slow.test/in"}
    )
    assert time.monotonic() - started < 2.0
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_callback_url" and "did not resolve in time" in error["message"]
    assert not ToolCall.objects.exists()
