"""Assembly of the demo MCP server: the SDK's MCPServer, its tools, and the HTTP layers around it.

Request path, outermost first: the body size limit -> request recording (test hooks) -> Idempotency-Key
replay -> holds (test hooks) -> the SDK's Streamable HTTP app at /mcp (JSON answers; 2026-07-28 stateless,
the handshake era on a session).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from mcp.server.context import ServerMiddleware
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, RequestBodyLimitMiddleware
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from approvals.demo import conformance_tools, tools
from approvals.demo._asgi import MCP_PATH, handshake_era
from approvals.demo.hooks import DemoHooks, HoldRequests, RecordRequests
from approvals.demo.idempotency import IdempotencyMiddleware, IdempotencyStore
from approvals.demo.replay import OneOutcome

NAME = "elicit-demo"
VERSION = "0.1.0"
# Development only. A fixed key (not the SDK's per-process default) is what lets a round's state
# survive a restart of the demo server; deployments set ELICIT_DEMO_STATE_KEY.
DEFAULT_STATE_KEY = "elicit-hub-demo-request-state-key-for-development-only"


def state_ttl() -> float:
    """ELICIT_DEMO_STATE_TTL in seconds (600 when unset); a ValueError naming it when it is not usable."""
    raw = os.environ.get("ELICIT_DEMO_STATE_TTL") or "600"
    try:
        ttl = float(raw)
    except ValueError:
        ttl = math.nan
    if not (math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"ELICIT_DEMO_STATE_TTL must be a positive number of seconds, not {raw!r}")
    return ttl


def state_security() -> RequestStateSecurity:
    """AES-GCM sealing of requestState, bound by the SDK to the tool, its arguments and a TTL."""
    key = os.environ.get("ELICIT_DEMO_STATE_KEY") or DEFAULT_STATE_KEY
    return RequestStateSecurity(keys=[key], ttl=state_ttl())


def build_server(middleware: Sequence[ServerMiddleware[Any]] = ()) -> MCPServer:
    mcp = MCPServer(
        NAME,
        title="Elicit Hub demo server",
        version=VERSION,
        instructions="Tools that ask a human before acting, for trying Elicit Hub end to end.",
        request_state_security=state_security(),
        # Outermost of ours: a refused replay never reaches a tool nor its execution count.
        middleware=[OneOutcome(ttl=state_ttl()), *middleware],
        log_level="WARNING",
    )
    tools.register(mcp)
    conformance_tools.register(mcp)
    return mcp


def hooks_enabled() -> bool:
    return os.environ.get("ELICIT_DEMO_TEST_HOOKS") == "1"


def build_app(*, host: str = "127.0.0.1", test_hooks: bool | None = None) -> ASGIApp:
    """The whole ASGI app; `host` is the bind address, which the SDK uses for DNS-rebinding protection."""
    if test_hooks is None:
        test_hooks = hooks_enabled()
    store = IdempotencyStore()
    hooks = DemoHooks(on_reset=store.clear)
    mcp = build_server(middleware=[hooks.count_executions])

    @mcp.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "server": NAME})

    if test_hooks:
        hooks.install_routes(mcp)
    app: ASGIApp = EraRouter(
        modern=mcp.streamable_http_app(json_response=True, stateless_http=True, host=host),
        # A session, and an event stream per call: what `eras.dual_era` asks the client for input on.
        handshake=mcp.streamable_http_app(json_response=False, stateless_http=False, host=host),
    )
    if test_hooks:
        app = HoldRequests(app, hooks)
    app = IdempotencyMiddleware(app, store)
    if test_hooks:
        app = RecordRequests(app, hooks)
    # The SDK limits the bodies its own app reads, but the layers above buffer a body before it gets there:
    # without the same limit outermost, one request with an Idempotency-Key could fill the memory.
    return RequestBodyLimitMiddleware(app, DEFAULT_MAX_REQUEST_BODY_SIZE)


class EraRouter:
    """The SDK's app twice over one server: JSON answers without a session for 2026-07-28 requests, and a
    session with an event stream per call for the handshake era (its `initialize`, and every request
    naming a handshake-era version or none). The SDK sets both for a whole app, and a JSON answer cannot
    carry a request to the client in the middle of a call."""

    def __init__(self, *, modern: Starlette, handshake: Starlette) -> None:
        self.modern = modern
        self.handshake = handshake

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"].rstrip("/") == MCP_PATH and handshake_era(scope):
            await self.handshake(scope, receive, send)
        else:
            await self.modern(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Both apps' session managers run for as long as the server does."""
        await receive()  # lifespan.startup
        async with AsyncExitStack() as stack:
            try:
                for app in (self.modern, self.handshake):
                    await stack.enter_async_context(app.router.lifespan_context(app))
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})
