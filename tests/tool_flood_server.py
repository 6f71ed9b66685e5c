"""A hostile MCP server whose tool lists never end or cannot be stored (run as a subprocess).

    python tests/tool_flood_server.py PORT

A hand-written JSON-RPC endpoint served by uvicorn on 127.0.0.1:PORT, so that it can send what the SDK's
server never would. It speaks both eras on the same URL: ``server/discover`` (2026-07-28, stateless) and
``initialize`` (the handshake era, with an ``Mcp-Session-Id``). ``tools/call`` answers with the tool's
name. ``/{mode}/mcp`` lists tools according to `mode`:

- ``flood``: ``?per_page=`` tools per page (default 50), each page with a ``nextCursor``: it never ends.
- ``heavy``: the same, each tool with a ``?kb=``-kilobyte description (default 64), 8 per page.
- ``nul``: one page: ``fine``, ``nul`` (a NUL in its description, as the JSON escape ``\\u0000``),
  ``nul_key`` (a NUL in a property name of its input schema) and ``also_fine``. (A lone surrogate needs no
  server: the SDK's JSON parser refuses the whole answer, a clear ``malformed_response``.)

``GET /_pages`` says how many ``tools/list`` requests each mode received; ``POST /_reset`` zeroes them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

PAGES: dict[str, int] = {}
SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}}
INFO = {"name": "tool-flood", "version": "6.6.6"}
PAGE_FIELDS = '{"resultType": "complete", "ttlMs": 0, "cacheScope": "public"}'


def _tool(name: str, description: str = "A tool") -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": SCHEMA}


def _page(mode: str, cursor: str | None, request: Request) -> str:
    """The ``tools/list`` result as JSON text (raw, so that it may carry escapes Python would not send)."""
    if mode == "nul":
        key = {**_tool("nul_key"), "inputSchema": {"type": "object", "properties": {"a\\u0000b": {}}}}
        tools = [_tool("fine"), _tool("nul", "a\\u0000b"), key, _tool("also_fine")]
        texts = [json.dumps(tool).replace("\\\\u", "\\u") for tool in tools]
        return '{"tools": [' + ",".join(texts) + "], " + PAGE_FIELDS[1:]
    page = int(cursor or 0)
    heavy = mode == "heavy"
    per_page = 8 if heavy else int(request.query_params.get("per_page", "50"))
    description = "d" * (int(request.query_params.get("kb", "64")) * 1024) if heavy else "A tool"
    tools = [_tool(f"tool_{page * per_page + i}", description) for i in range(per_page)]
    return json.dumps({"tools": tools, "nextCursor": str(page + 1), **json.loads(PAGE_FIELDS)})


def _answer(rid: Any, result: str) -> Response:
    body = '{"jsonrpc": "2.0", "id": ' + json.dumps(rid) + ', "result": ' + result + "}"
    return Response(body, media_type="application/json")


def _result(method: str, params: dict[str, Any], mode: str, request: Request) -> str | None:
    if method == "initialize":
        return json.dumps(
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": INFO,
            }
        )
    if method == "server/discover":
        return json.dumps(
            {
                "resultType": "complete",
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {"listChanged": True}},
                "ttlMs": 0,
                "cacheScope": "private",
                "_meta": {"io.modelcontextprotocol/serverInfo": INFO},
            }
        )
    if method == "tools/list":
        PAGES[mode] = PAGES.get(mode, 0) + 1
        return _page(mode, params.get("cursor"), request)
    if method == "tools/call":
        text = f"called {params.get('name')}"
        return json.dumps({"resultType": "complete", "content": [{"type": "text", "text": text}]})
    if method == "ping":
        return "{}"
    return None


async def endpoint(request: Request) -> Response:
    if request.method != "POST":
        return Response(status_code=405)
    body = json.loads(await request.body())
    if "id" not in body:
        return Response(status_code=202)  # a notification
    result = _result(body.get("method", ""), body.get("params") or {}, request.path_params["mode"], request)
    if result is None:
        error = {"code": -32601, "message": "Method not found"}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "error": error}, status_code=404)
    response = _answer(body["id"], result)
    if body.get("method") == "initialize":
        response.headers["Mcp-Session-Id"] = "flood-session"
    return response


async def pages(request: Request) -> Response:
    return JSONResponse(PAGES)


async def reset(request: Request) -> Response:
    PAGES.clear()
    return JSONResponse({"ok": True})


app = Starlette(
    routes=[
        Route("/_pages", pages, methods=["GET"]),
        Route("/_reset", reset, methods=["POST"]),
        Route("/{mode}/mcp", endpoint, methods=["POST", "GET", "DELETE"]),
    ]
)


def main() -> None:
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")


if __name__ == "__main__":
    main()
