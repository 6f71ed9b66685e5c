"""Servers that misbehave: the call ends ``failed`` with a clear error after bounded retries, never stuck."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client

from approvals.models import AuditEvent, Round, ToolCall
from tests import demo_support
from tests.conftest import WORKER_ENV
from tests.hub import Hub, WebhookReceiver, set_up_hub

pytestmark = pytest.mark.timeout(180)


class FaultyServer:
    """An HTTP endpoint that answers every POST the same broken way."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.hits = 0

    def __enter__(self) -> FaultyServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                server.hits += 1
                if server.mode == "500":
                    self.send_response(500)
                    self.end_headers()
                elif server.mode == "429":
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                    self.end_headers()
                elif server.mode == "malformed":
                    body = b"this is not json {"
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif server.mode == "slow":
                    time.sleep(float(WORKER_ENV["ELICIT_MCP_TIMEOUT"]) + 2)
                    self.send_response(500)
                    self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/mcp"


@pytest.fixture
def hub(worker, demo_server) -> Iterator[Hub]:
    demo_support.reset(demo_server.url)
    yield set_up_hub(demo_server.url)


@pytest.mark.parametrize(
    ("mode", "code", "transient"),
    [
        ("500", "http_5xx", True),
        ("429", "rate_limited", True),
        ("slow", "timeout", True),
        ("malformed", "malformed_response", False),
    ],
)
def test_a_broken_server_fails_the_call_clearly(hub: Hub, mode: str, code: str, transient: bool) -> None:
    with FaultyServer(mode) as faulty:
        hub.server.url = faulty.url
        hub.server.save()
        call_id = hub.agent.call("echo", {"text": "hi"})
        body = hub.agent.wait(call_id, 60)
    assert body["status"] == "failed", body
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    retries = int(WORKER_ENV["ELICIT_MCP_MAX_RETRIES"])
    scheduled = AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").count()
    assert scheduled == (retries if transient else 0)
    assert not ToolCall.objects.filter(status__in=["running", "resuming", "queued"]).exists()


def test_a_rejected_request_state_fails_the_call_without_retrying(hub: Hub) -> None:
    with WebhookReceiver() as hook:
        call_id = hub.agent.call("create_deployment", {"branch": "main"}, callback_url=hook.url)
        item = hub.reviewer.wait_for_request(call_id, "environment")
        # The server no longer recognises the state it sealed (as after a key rotation or its TTL).
        Round.objects.filter(call_id=call_id).update(request_state="tampered-state")
        hub.reviewer.respond(item["id"], "accept", {"environment": "staging"})
        body = hub.agent.wait(call_id)
        assert body["status"] == "failed"
        assert body["error"]["code"] == "request_state_rejected"
        assert body["error"]["rpc_code"] == -32602
        assert hook.wait_for("call.failed").json()["data"]["error"]["code"] == "request_state_rejected"
    assert not AuditEvent.objects.filter(call_id=call_id, verb="call.retry_scheduled").exists()
    assert Round.objects.get(call_id=call_id).status == Round.Status.CLOSED


def test_request_state_never_leaves_the_database(hub: Hub, demo_server, worker, web) -> None:
    with WebhookReceiver() as hook:
        call_id = hub.agent.call("create_deployment", {"branch": "main"}, callback_url=hook.url)
        item = hub.reviewer.wait_for_request(call_id, "environment")
        state = Round.objects.get(call_id=call_id).request_state
        assert state and len(state) > 20
        seen: list[str] = [
            json.dumps(hub.agent.get(f"/calls/{call_id}").json()),
            json.dumps(hub.reviewer.inbox()),
        ]
        browser = Client()
        browser.force_login(hub.reviewer_user)
        for path in ["/", f"/calls/{call_id}/", f"/requests/{item['id']}/", "/recent/"]:
            response = browser.get(path)
            if response.status_code == 200:
                seen.append(response.content.decode())
        hub.reviewer.respond(item["id"], "accept", {"environment": "production"})
        confirm = hub.reviewer.wait_for_request(call_id, "confirm")
        # A round's state is forgotten once the server answered its retry: each is read while its round waits.
        second = Round.objects.get(call_id=call_id, number=2).request_state
        hub.reviewer.respond(confirm["id"], "accept", {"confirm": True})
        seen.append(json.dumps(hub.agent.wait(call_id)))
        hook.wait_for("call.completed")
        seen.extend(r.body.decode() for r in hook.received)
    states = [s for s in (state, second) if s]
    assert len(states) == 2
    assert not Round.objects.filter(call_id=call_id, request_state__isnull=False).exists()
    seen.extend(json.dumps([e.data, e.verb, e.actor_label]) for e in AuditEvent.objects.all())
    seen.append(worker.log())
    seen.append(web.log())
    for text in seen:
        for secret in states:
            assert secret not in text
