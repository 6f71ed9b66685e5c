"""``elicit_hub.door.BodyLimit``, the ASGI check in front of the API server, as pure logic: what it hands the
application and what it answers (the real servers are driven in test_body_limit_wire.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from elicit_hub.door import BodyLimit

LIMIT = 100


class App:
    """Records the request as the application reads it."""

    def __init__(self) -> None:
        self.called = False
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        self.messages.append(await receive())
        self.messages.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run(
    path: str, messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[App, list[dict[str, Any]], int]:
    """Drive BodyLimit(App) with `messages` as what the client sends; what the app saw, what was sent, and
    how many messages were read from the client."""
    app, sent, pending = App(), [], list(messages)
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": headers or []}
    async_to_sync(BodyLimit(app, LIMIT))(scope, receive, send)
    return app, sent, read


def chunk(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_in_chunks_within_the_limit_reaches_the_app_whole_then_the_disconnect() -> None:
    app, sent, _ = run("/api/v1/calls", [chunk(b"a" * 60, True), chunk(b"b" * 40, False)])
    assert app.messages == [chunk(b"a" * 60 + b"b" * 40, False), {"type": "http.disconnect"}]
    assert sent[0]["status"] == 200


def test_a_declared_length_over_the_limit_is_refused_without_reading_anything() -> None:
    app, sent, read = run("/api/v1/calls", [chunk(b"x", False)], [(b"content-length", b"101")])
    assert not app.called
    assert read == 0  # nothing read: a client that sent "Expect: 100-continue" is never told to continue
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["code"] == "body_too_large"


def test_a_chunked_body_is_refused_at_the_chunk_that_passes_the_limit() -> None:
    chunks = [chunk(b"x" * 60, True), chunk(b"x" * 60, True), chunk(b"x" * 60, False)]
    app, sent, read = run("/accounts/login/", chunks)
    assert not app.called
    assert read == 2  # the third chunk is never read
    assert sent[0]["status"] == 413
    assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/html")
    assert b"Too much to send" in sent[1]["body"]


def test_a_body_of_exactly_the_limit_passes() -> None:
    app, sent, _ = run("/api/v1/calls", [chunk(b"x" * LIMIT, False)], [(b"content-length", b"100")])
    assert app.messages[0]["body"] == b"x" * LIMIT
    assert sent[0]["status"] == 200


def test_a_client_that_leaves_before_its_body_is_in_reaches_nobody() -> None:
    app, sent, _ = run("/api/v1/calls", [chunk(b"x" * 10, True), {"type": "http.disconnect"}])
    assert not app.called
    assert sent == []


@pytest.mark.parametrize("scope_type", ["websocket", "lifespan"])
def test_other_connections_pass_through_untouched(scope_type: str) -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> dict[str, Any]:
        raise AssertionError("read by the door")

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("answered by the door")

    async_to_sync(BodyLimit(app, LIMIT))({"type": scope_type, "path": "/ws/queue/"}, nothing, send)
    assert seen == [scope_type]
