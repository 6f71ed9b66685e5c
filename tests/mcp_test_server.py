"""A small MCP 2026-07-28 server for the client tests (run as a subprocess).

    python tests/mcp_test_server.py PORT [--sse]

Built on the official SDK (`MCPServer`), served by uvicorn on 127.0.0.1:PORT:

- ``/mcp``: the real server (JSON answers, or SSE with ``--sse``). Tools: ``echo``, ``ask_name``
  (one elicitation round), ``two_rounds`` (two rounds, a new state each), ``state_only`` (a round
  with only a ``requestState``), ``slow`` (sleeps), ``fail`` (an ``isError`` result),
  ``ask_sampling`` (a sampling input request), ``deploy`` (arguments with ``x-mcp-header``
  annotations), ``typed_out`` (an output schema its result breaks), ``long_job`` (reports progress
  while it sleeps; not idempotent) and ``long_job_idempotent`` (the same, annotated idempotent).
- ``/scripted/{mode}``: a hand-written JSON-RPC endpoint for broken or odd servers. It answers
  ``tools/list`` normally and ``tools/call`` according to ``mode``.
- ``GET /canary``: a schema that must never be fetched (a network ``$ref`` target); recorded.
- ``GET /_seen``: the requests the server received (path, headers, JSON body), oldest first;
  ``POST /_reset`` forgets them.
- ``GET /_runs``: how many times each long tool started running (``{tool: n}``); ``/_reset`` zeroes it.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    SamplingMessage,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

SEEN: list[dict[str, Any]] = []
FLAGS: dict[str, bool] = {}
RUNS: dict[str, int] = {}

mcp = MCPServer("elicit-hub-test-server", version="1.0.0")

NAME_FORM = ElicitRequest(
    params=ElicitRequestFormParams(
        message="What is your name?",
        requested_schema={
            "type": "object",
            "properties": {"name": {"type": "string", "default": "Alice"}},
            "required": ["name"],
        },
    )
)


def _answer(ctx: Context, key: str) -> dict[str, Any] | None:
    responses = ctx.input_responses or {}
    answer = responses.get(key)
    if answer is None:
        return None
    return answer.model_dump(by_alias=True, mode="json", exclude_none=True)


@mcp.tool()
def echo(text: str) -> str:
    """Return the text."""
    return f"echo: {text}"


@mcp.tool()
def ask_name(greeting: str, ctx: Context) -> str | InputRequiredResult:
    """Ask for a name, then greet."""
    answer = _answer(ctx, "user_name")
    if answer is None or answer.get("action") != "accept":
        return InputRequiredResult(input_requests={"user_name": NAME_FORM}, request_state="round-1")
    return f"{greeting}, {answer['content']['name']}! (state={ctx.request_state})"


@mcp.tool()
def two_rounds(ctx: Context) -> str | InputRequiredResult:
    """Two elicitation rounds, each with its own state."""
    if ctx.request_state is None:
        return InputRequiredResult(input_requests={"step1": NAME_FORM}, request_state="s1")
    if ctx.request_state == "s1":
        return InputRequiredResult(input_requests={"step2": NAME_FORM}, request_state="s2")
    return f"done after {ctx.request_state}"


@mcp.tool()
def state_only(ctx: Context) -> str | InputRequiredResult:
    """A round with no input requests, only a state (load shedding)."""
    if ctx.request_state is None:
        return InputRequiredResult(request_state="later")
    return "resumed"


@mcp.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return "slept"


async def _long_job(name: str, seconds: float, steps: int, ctx: Context) -> str:
    RUNS[name] = RUNS.get(name, 0) + 1
    for step in range(steps):
        await ctx.report_progress(step, steps, f"step {step + 1} of {steps}")
        await anyio.sleep(seconds / steps)
    await ctx.report_progress(steps, steps, "done")
    return f"finished {steps} steps in {seconds} s"


@mcp.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
async def long_job(seconds: float, ctx: Context, steps: int = 4) -> str:
    """Work for `seconds`, reporting progress `steps` times (not safe to repeat)."""
    return await _long_job("long_job", seconds, steps, ctx)


@mcp.tool(annotations=ToolAnnotations(idempotent_hint=True))
async def long_job_idempotent(seconds: float, ctx: Context, steps: int = 4) -> str:
    """The same work, declared idempotent (safe to repeat)."""
    return await _long_job("long_job_idempotent", seconds, steps, ctx)


@mcp.tool()
def fail(reason: str) -> str:
    """Always fail as a tool error."""
    raise ToolError(f"failed: {reason}")


@mcp.tool()
def ask_sampling(ctx: Context) -> str | InputRequiredResult:
    """Ask the client for an LLM completion (which the hub does not support)."""
    return InputRequiredResult(
        input_requests={
            "capital_question": CreateMessageRequest(
                params=CreateMessageRequestParams(
                    messages=[
                        SamplingMessage(
                            role="user", content=TextContent(type="text", text="Capital of France?")
                        )
                    ],
                    max_tokens=50,
                )
            )
        },
        request_state="sampling",
    )


@mcp.tool()
def deploy(
    region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
    dry_run: Annotated[bool, Field(json_schema_extra={"x-mcp-header": "Dry-Run"})] = False,
    priority: Annotated[int, Field(json_schema_extra={"x-mcp-header": "Priority"})] = 0,
    note: str = "",
) -> str:
    """Arguments mirrored into Mcp-Param-* headers."""
    return f"deploy {region} dry_run={dry_run} priority={priority} note={note!r}"


class Typed(BaseModel):
    count: int


@mcp.tool()
def typed_out() -> Typed:
    """Declares an output schema, then breaks it (below, by patching the result)."""
    return Typed(count=1)


# ---- scripted endpoint -------------------------------------------------------------------------

SCRIPTED_TOOL = {
    "name": "scripted",
    "description": "A scripted tool",
    "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
}


def _tools_page(mode: str, cursor: str | None, request: Request) -> dict[str, Any]:
    tools: list[dict[str, Any]] = [SCRIPTED_TOOL]
    next_cursor = None
    if mode == "paged":
        if cursor is None:
            tools, next_cursor = [{**SCRIPTED_TOOL, "name": "first_page"}], "page-2"
        else:
            tools = [{**SCRIPTED_TOOL, "name": "second_page"}]
    elif mode == "invalid_headers":
        tools = [
            {
                "name": "valid_tool",
                "inputSchema": {
                    "type": "object",
                    "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
                },
            },
            {
                "name": "invalid_number_header",
                "inputSchema": {
                    "type": "object",
                    "properties": {"score": {"type": "number", "x-mcp-header": "Score"}},
                },
            },
        ]
    elif mode == "network_ref":
        canary = f"{request.base_url}canary"
        tools = [
            {
                "name": "lookup_user",
                "inputSchema": {
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "$defs": {"userId": {"type": "string", "pattern": "^[a-z0-9-]+$"}},
                    "properties": {"id": {"$ref": "#/$defs/userId"}, "profile": {"$ref": canary}},
                    "required": ["id"],
                    "additionalProperties": False,
                },
            }
        ]
    page: dict[str, Any] = {"resultType": "complete", "tools": tools, "ttlMs": 0, "cacheScope": "public"}
    if next_cursor is not None:
        page["nextCursor"] = next_cursor
    return page


def _rpc(request_id: Any, result: dict[str, Any]) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": result})


def _rpc_error(request_id: Any, code: int, message: str, data: Any = None, status: int = 200) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error}, status_code=status)


@mcp.custom_route("/scripted/{mode}", methods=["POST"])
async def scripted(request: Request) -> Response:
    mode = request.path_params["mode"]
    body = json.loads(await request.body())
    rid = body.get("id")
    method = body.get("method")
    if mode == "error500":
        return Response("upstream exploded", status_code=500, media_type="text/plain")
    if mode == "ratelimited":
        return Response("slow down", status_code=429, headers={"Retry-After": "7"}, media_type="text/plain")
    if mode == "unauthorized":
        return Response("no", status_code=401, media_type="text/plain")
    if mode == "old_version":
        return _rpc_error(
            rid,
            -32022,
            "Unsupported protocol version",
            {"supported": ["2025-11-25"], "requested": "2026-07-28"},
            status=400,
        )
    if mode == "reject_first_version" and not FLAGS.get("version_rejected"):
        FLAGS["version_rejected"] = True
        return _rpc_error(
            rid,
            -32022,
            "Unsupported protocol version",
            {"supported": ["2026-07-28"], "requested": "2026-07-28"},
            status=400,
        )
    if method == "tools/list":
        return _rpc(rid, _tools_page(mode, (body.get("params") or {}).get("cursor"), request))
    if mode == "malformed":
        return Response('{"jsonrpc": "2.0", "id": ', media_type="application/json")
    if mode == "html":
        return Response("<html>hello</html>", media_type="text/html")
    if mode == "wrong_shape":
        return _rpc(rid, {"resultType": "complete", "content": "not a list"})
    if mode == "no_result_type":
        return _rpc(rid, {"content": [{"type": "text", "text": "complete without resultType"}]})
    if mode == "unknown_result_type":
        return _rpc(rid, {"resultType": "mystery", "content": []})
    if mode == "bad_elicitation":
        return _rpc(
            rid,
            {
                "resultType": "input_required",
                "inputRequests": {
                    "k": {"method": "elicitation/create", "params": {"mode": "url", "message": "x"}}
                },
                "requestState": "s",
            },
        )
    if mode == "roots":
        return _rpc(
            rid,
            {"resultType": "input_required", "inputRequests": {"client_roots": {"method": "roots/list"}}},
        )
    if mode == "rpc_error":
        return _rpc_error(rid, -32603, "Internal error")
    if mode == "url_elicitation":
        return _rpc(
            rid,
            {
                "resultType": "input_required",
                "inputRequests": {
                    "login": {
                        "method": "elicitation/create",
                        "params": {
                            "mode": "url",
                            "message": "Log in",
                            "url": "https://example.invalid/login",
                        },
                    }
                },
                "requestState": "u",
                "_meta": {"vendor/x": 1},
            },
        )
    if method == "tools/call" and mode in OVERSIZED:
        return _oversized(mode, rid, body.get("params") or {}, int(request.query_params.get("n", "10")))
    if method == "tools/call":
        return _rpc(rid, {"resultType": "complete", "content": [{"type": "text", "text": f"{mode} ok"}]})
    return _rpc_error(rid, -32601, "Method not found", status=404)


# Servers that send too much (``?n=`` sets how much), or what cannot be stored; once the hub answers a
# round (inputResponses), they complete, saying which actions they received.
OVERSIZED = {"many_inputs", "long_message", "big_schema", "big_result", "nul_result", "surrogate_result"}


def _form(message: str, schema_extra: str = "") -> dict[str, Any]:
    schema = {"type": "object", "properties": {"name": {"type": "string", "description": schema_extra}}}
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": schema},
    }


def _oversized(mode: str, rid: Any, params: dict[str, Any], n: int) -> Response:
    answered = params.get("inputResponses")
    if answered:
        actions = sorted({str((r or {}).get("action")) for r in answered.values()})
        text = f"answered {len(answered)}: {','.join(actions)}"
        return _rpc(rid, {"resultType": "complete", "content": [{"type": "text", "text": text}]})
    if mode == "big_result":
        return _rpc(
            rid, {"resultType": "complete", "content": [{"type": "text", "text": "x" * n}], "isError": True}
        )
    if mode in ("nul_result", "surrogate_result"):
        bad = "\\u0000" if mode == "nul_result" else "\\ud800"
        content = '[{"type":"text","text":"a' + bad + 'b"}]'
        raw = '{"jsonrpc":"2.0","id":' + json.dumps(rid) + ',"result":{"resultType":"complete","content":'
        return Response(raw + content + "}}", media_type="application/json")
    if mode == "many_inputs":
        requests = {f"k{i}": _form(f"Question {i}") for i in range(n)}
    elif mode == "long_message":
        requests = {"fine": _form("A short question"), "long": _form("m" * n)}
    else:
        requests = {"fine": _form("A short question"), "big": _form("Pick", "d" * n)}
    return _rpc(rid, {"resultType": "input_required", "inputRequests": requests, "requestState": "st"})


@mcp.custom_route("/_seen", methods=["GET"])
async def seen(request: Request) -> Response:
    return JSONResponse(SEEN)


@mcp.custom_route("/_runs", methods=["GET"])
async def runs(request: Request) -> Response:
    return JSONResponse(RUNS)


@mcp.custom_route("/canary", methods=["GET"])
async def canary(request: Request) -> Response:
    SEEN.append({"path": "/canary", "headers": [], "body": None})
    return JSONResponse({"type": "object"})


@mcp.custom_route("/_reset", methods=["POST"])
async def reset(request: Request) -> Response:
    SEEN.clear()
    FLAGS.clear()
    RUNS.clear()
    return JSONResponse({"ok": True})


class Recorder:
    """ASGI middleware: remember each POST (path, headers, JSON body) for the tests to inspect."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] == "/_reset":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        SEEN.append(
            {
                "path": scope["path"],
                "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
                "body": body,
            }
        )
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _break_typed_out() -> None:
    """Make `typed_out` return structured content that violates its output schema."""
    tool = mcp._tool_manager.get_tool("typed_out")  # test-only reach into the SDK
    assert tool is not None
    original = tool.fn

    def broken() -> CallToolResult:
        original()
        return CallToolResult(
            content=[TextContent(type="text", text='{"count": "not a number"}')],
            structured_content={"count": "not a number"},
        )

    tool.fn = broken
    tool.fn_metadata.output_model = None  # skip server-side conversion so the bad value goes out


def main() -> None:
    port = int(sys.argv[1])
    sse = "--sse" in sys.argv[2:]
    try:
        _break_typed_out()
    except Exception as exc:  # pragma: no cover - the tests notice the missing behaviour
        print(f"could not break typed_out: {exc}", file=sys.stderr)
    app = Recorder(mcp.streamable_http_app(json_response=not sse, stateless_http=True))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
