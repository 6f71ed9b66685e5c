"""Drive the hub as its users do: an agent and reviewers over the HTTP API, a webhook receiver."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import connections
from django.test import Client

from approvals.models import McpServer, Membership
from tests import factories
from tests.live import wait_until


def off_the_loop(send: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`send(*args, **kwargs)` (a request, or any ORM work) where the ORM may run. Django refuses it, and a
    long-poll's async_to_sync too, on a thread with a running event loop (Playwright's sync API keeps one):
    there, it runs on another thread. A thread other than the main one (a test's `anyio.to_thread` worker)
    gives its connection back after each request: it may end at any time, and a connection left on an ended
    thread holds its session until a garbage collection."""

    def in_thread() -> Any:
        try:
            return send(*args, **kwargs)
        finally:
            connections.close_all()  # this thread's own database connection

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        if threading.current_thread() is threading.main_thread():
            return send(*args, **kwargs)
        return in_thread()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(in_thread).result()


class ApiClient:
    def __init__(self, token: str) -> None:
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def get(self, path: str, **params: Any) -> Any:
        return off_the_loop(self.client.get, f"/api/v1{path}", params)

    def post(self, path: str, body: Any) -> Any:
        raw = body if isinstance(body, str | bytes) else json.dumps(body)
        return off_the_loop(self.client.post, f"/api/v1{path}", raw, content_type="application/json")


class Agent(ApiClient):
    def call(self, tool: str, arguments: dict | None = None, **extra: Any) -> str:
        response = self.post(
            "/calls",
            {"server": extra.pop("server", "demo"), "tool": tool, "arguments": arguments or {}, **extra},
        )
        assert response.status_code == 202, response.content
        return response.json()["id"]

    def wait(self, call_id: str, seconds: int = 30) -> dict[str, Any]:
        response = self.get(f"/calls/{call_id}", wait=seconds)
        assert response.status_code == 200, response.content
        return response.json()


class Reviewer(ApiClient):
    def inbox(self) -> list[dict[str, Any]]:
        response = self.get("/inbox")
        assert response.status_code == 200, response.content
        return response.json()

    def wait_for_request(self, call_id: str, key: str, timeout: float = 30) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            return next((i for i in self.inbox() if i["call"] == call_id and i["key"] == key), None)

        return wait_until(find, timeout, 0.1, what=f"{key} of call {call_id} in the inbox")  # type: ignore[return-value]

    def respond(self, request_id: str, action: str = "accept", content: Any = None, reason: str = "") -> Any:
        body: dict[str, Any] = {"action": action}
        if content is not None:
            body["content"] = content
        if reason:
            body["reason"] = reason
        return self.post(f"/input-requests/{request_id}/respond", body)


@dataclass
class Hub:
    server: McpServer
    agent: Agent
    agent_secret: str
    reviewer: Reviewer
    reviewer_user: Any


def set_up_hub(demo_url: str, *, slug: str = "demo", honours_idempotency_key: bool = True) -> Hub:
    """The demo server registered for team "release", an agent allowed to call it, one reviewer.

    The demo server honours Idempotency-Key, and is registered so unless the test says otherwise."""
    from approvals.services import tokens

    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = McpServer.objects.create(
        slug=slug,
        name="Deploy bot",
        url=demo_url,
        default_team=release,
        honours_idempotency_key=honours_idempotency_key,
    )
    agent, agent_token = tokens.agent_create(name="ci-agent", servers=[server], with_webhook_secret=True)
    _, reviewer_token = tokens.personal_token_create(user=alice)
    return Hub(server, Agent(agent_token), agent.webhook_secret, Reviewer(reviewer_token), alice)


def set_up_handshake_hub(url: str, *, slug: str) -> Hub:
    """A hub whose server at `url` speaks the handshake era (its calls run on a holder's session), with a
    30 s call limit, and is not safe to send again."""
    hub = set_up_hub(url, slug=slug, honours_idempotency_key=False)
    McpServer.objects.filter(pk=hub.server.pk).update(era=McpServer.Era.HANDSHAKE, call_timeout=30)
    hub.server.refresh_from_db()
    return hub


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """A loopback HTTP endpoint that records every POST; ``fail_first`` answers 500 that many times, or
    ``statuses`` answers each POST with the next of them (the last once they run out), with the headers of
    the same place in ``headers`` (a ``Retry-After``, say). ``query`` ends the URL (a receiver's token,
    say)."""

    fail_first: int = 0
    statuses: tuple[int, ...] = ()
    headers: tuple[dict[str, str], ...] = ()
    query: str = ""
    received: list[Received] = field(default_factory=list)

    def _status(self) -> int:
        count = len(self.received)
        if self.statuses:
            return self.statuses[min(count, len(self.statuses)) - 1]
        return 500 if count <= self.fail_first else 204

    def _headers(self) -> dict[str, str]:
        count = len(self.received)
        return self.headers[min(count, len(self.headers)) - 1] if self.headers else {}

    def __enter__(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver._status())
                for name, value in receiver._headers().items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hook{self.query}"

    def wait_for(self, event_type: str, timeout: float = 30) -> Received:
        def find() -> Received | None:
            return next((r for r in self.received if r.json().get("type") == event_type), None)

        return wait_until(find, timeout, 0.1, what=f"webhook {event_type}")  # type: ignore[return-value]
