"""Test hooks: what tests need to observe and steer inside the demo server.

Mounted only when `ELICIT_DEMO_TEST_HOOKS=1`; JSON over HTTP so a test can drive a server that runs
in another process:

    GET  /test-hooks/executions  {"<tool>": n}: tool runs that ended in a complete, non-error result
    GET  /test-hooks/requests    [{"headers": {...}, "body": {...}}]: every POST to /mcp, oldest first
    POST /test-hooks/hold        {"tool", "phase": "before"|"after", "seconds"}: hold that tool's next retry
    GET  /test-hooks/inflight    {"held": n, "phase": "before"|"after"|null, "armed": [...]}
    POST /test-hooks/describe    {"tool", "description"}: the server now describes that tool so (tools/list)
    POST /test-hooks/reset       forget all of it, release held requests, empty the idempotency cache, and
                                 restore the tools' descriptions
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from approvals.demo._asgi import buffer_body, capture, is_mcp_post, json_body, tool_call

PREFIX = "/test-hooks"
MAX_RECORDED = 2000
Phase = Literal["before", "after"]


@dataclass(frozen=True)
class Hold:
    tool: str
    phase: Phase
    seconds: float


class DemoHooks:
    def __init__(self, on_reset: Callable[[], None] = lambda: None) -> None:
        self.executions: Counter[str] = Counter()
        self.requests: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._armed: dict[str, Hold] = {}
        self._held: list[Phase] = []
        # Created on first use: an anyio Event needs the running event loop.
        self._release: anyio.Event | None = None
        self._on_reset = on_reset
        self._mcp: MCPServer | None = None
        self._descriptions: dict[str, str] = {}  # the originals of the descriptions changed

    async def count_executions(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """SDK server middleware: count each tool run that ended with its final, successful result."""
        result = await call_next(ctx)
        if ctx.method == "tools/call" and _is_final_success(result):
            self.executions[str((ctx.params or {}).get("name"))] += 1
        return result

    def record(self, scope: Scope) -> None:
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
        }
        self.requests.append({"headers": headers, "body": json_body(scope)})

    def arm(self, hold: Hold) -> None:
        self._armed[hold.tool] = hold

    def take_hold(self, scope: Scope) -> Hold | None:
        """The armed hold for this request, if it is a retry (carries inputResponses) of that tool."""
        params = tool_call(scope)
        if params is None or not params.get("inputResponses"):
            return None
        return self._armed.pop(str(params.get("name")), None)

    async def wait(self, hold: Hold) -> None:
        if self._release is None:
            self._release = anyio.Event()
        self._held.append(hold.phase)
        try:
            with anyio.move_on_after(hold.seconds):
                await self._release.wait()
        finally:
            self._held.remove(hold.phase)

    def inflight(self) -> dict[str, Any]:
        return {
            "held": len(self._held),
            "phase": self._held[-1] if self._held else None,
            "armed": [asdict(hold) for hold in self._armed.values()],
        }

    def reset(self) -> None:
        self.executions.clear()
        self.requests.clear()
        self._armed.clear()
        for name, description in self._descriptions.items():
            self.describe(name, description)
        self._descriptions.clear()
        if self._release is not None:
            self._release.set()
            self._release = None
        self._on_reset()

    def describe(self, name: str, description: str) -> bool:
        """Change a tool's description, as a server changing its tool between two tools/list would."""
        tool = self._mcp._tool_manager.get_tool(name) if self._mcp else None  # test-only reach into the SDK
        if tool is None:
            return False
        self._descriptions.setdefault(name, tool.description)
        tool.description = description
        return True

    def install_routes(self, mcp: MCPServer) -> None:
        self._mcp = mcp
        mcp.custom_route(f"{PREFIX}/describe", methods=["POST"])(self._describe_view)
        mcp.custom_route(f"{PREFIX}/executions", methods=["GET"])(self._executions_view)
        mcp.custom_route(f"{PREFIX}/requests", methods=["GET"])(self._requests_view)
        mcp.custom_route(f"{PREFIX}/hold", methods=["POST"])(self._hold_view)
        mcp.custom_route(f"{PREFIX}/inflight", methods=["GET"])(self._inflight_view)
        mcp.custom_route(f"{PREFIX}/reset", methods=["POST"])(self._reset_view)

    async def _executions_view(self, request: Request) -> JSONResponse:
        return JSONResponse(dict(self.executions))

    async def _requests_view(self, request: Request) -> JSONResponse:
        return JSONResponse(list(self.requests))

    async def _inflight_view(self, request: Request) -> JSONResponse:
        return JSONResponse(self.inflight())

    async def _reset_view(self, request: Request) -> JSONResponse:
        self.reset()
        return JSONResponse({"reset": True})

    async def _describe_view(self, request: Request) -> JSONResponse:
        try:
            spec = await request.json()
            name, description = str(spec["tool"]), str(spec["description"])
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'expected {"tool": str, "description": str}'}, 400)
        if not self.describe(name, description):
            return JSONResponse({"error": f"no tool {name!r}"}, 404)
        return JSONResponse({"described": name})

    async def _hold_view(self, request: Request) -> JSONResponse:
        try:
            spec = await request.json()
            hold = Hold(tool=str(spec["tool"]), phase=spec["phase"], seconds=float(spec["seconds"]))
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'expected {"tool": str, "phase": str, "seconds": number}'}, 400)
        if hold.phase not in ("before", "after") or hold.seconds < 0:
            return JSONResponse({"error": 'phase must be "before" or "after", seconds >= 0'}, 400)
        self.arm(hold)
        return JSONResponse({"armed": asdict(hold)})


def _is_final_success(result: Any) -> bool:
    if isinstance(result, BaseModel):
        result = result.model_dump(by_alias=True, exclude_none=True)
    return (
        isinstance(result, Mapping)
        and result.get("resultType", "complete") == "complete"
        and not result.get("isError")
    )


class RecordRequests:
    """Outermost: records every POST to /mcp exactly as it arrived, replays included."""

    def __init__(self, app: ASGIApp, hooks: DemoHooks) -> None:
        self.app = app
        self.hooks = hooks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_mcp_post(scope):
            receive = await buffer_body(scope, receive)
            self.hooks.record(scope)
        await self.app(scope, receive, send)


class HoldRequests:
    """Innermost: holds an armed retry before the tool runs, or after it ran but before the answer leaves."""

    def __init__(self, app: ASGIApp, hooks: DemoHooks) -> None:
        self.app = app
        self.hooks = hooks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hold = None
        if is_mcp_post(scope):
            receive = await buffer_body(scope, receive)
            hold = self.hooks.take_hold(scope)
        if hold is None:
            await self.app(scope, receive, send)
        elif hold.phase == "before":
            await self.hooks.wait(hold)
            await self.app(scope, receive, send)
        else:
            response = await capture(self.app, scope, receive)
            await self.hooks.wait(hold)
            await response.send_to(send)
