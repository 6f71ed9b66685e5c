"""Assembly of the demo MCP server: the SDK's MCPServer, its tools, and the HTTP layers around it.

Request path, outermost first: request recording (test hooks) -> Idempotency-Key replay ->
holds (test hooks) -> the SDK's Streamable HTTP app at /mcp (JSON answers, stateless, 2026-07-28).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mcp.server.context import ServerMiddleware
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from approvals.demo import conformance_tools, tools
from approvals.demo.hooks import DemoHooks, HoldRequests, RecordRequests
from approvals.demo.idempotency import IdempotencyMiddleware, IdempotencyStore

NAME = "elicit-demo"
VERSION = "0.1.0"
# Development only. A fixed key (not the SDK's per-process default) is what lets a round's state
# survive a restart of the demo server; deployments set ELICIT_DEMO_STATE_KEY.
DEFAULT_STATE_KEY = "elicit-hub-demo-request-state-key-for-development-only"


def state_security() -> RequestStateSecurity:
    """AES-GCM sealing of requestState, bound by the SDK to the tool, its arguments and a TTL."""
    key = os.environ.get("ELICIT_DEMO_STATE_KEY") or DEFAULT_STATE_KEY
    ttl = float(os.environ.get("ELICIT_DEMO_STATE_TTL") or 600)
    return RequestStateSecurity(keys=[key], ttl=ttl)


def build_server(middleware: Sequence[ServerMiddleware[Any]] = ()) -> MCPServer:
    mcp = MCPServer(
        NAME,
        title="Elicit Hub demo server",
        version=VERSION,
        instructions="Tools that ask a human before acting, for trying Elicit Hub end to end.",
        request_state_security=state_security(),
        middleware=list(middleware),
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
    app: ASGIApp = mcp.streamable_http_app(json_response=True, stateless_http=True, host=host)
    if test_hooks:
        app = HoldRequests(app, hooks)
    app = IdempotencyMiddleware(app, store)
    if test_hooks:
        app = RecordRequests(app, hooks)
    return app
