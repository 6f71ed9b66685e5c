"""A hostile MCP server over Streamable HTTP, written by hand (run as a subprocess).

    python tests/mcx_hostile_server.py PORT

It answers both eras on ``/mcp``: a request carrying ``MCP-Protocol-Version: 2026-07-28`` statelessly, and
``initialize`` with a handshake-era session (``Mcp-Session-Id``, 2025-11-25). ``/v/{version}/mcp`` is the same
server answering ``initialize`` with protocol version ``version``. ``tools/list`` lists every tool below;
``tools/call`` misbehaves by tool name:

- ``big_sse``: the result in one SSE event of ``BIG`` bytes: over the SDK's default bound on an event
  (1 MiB), well under the hub's bound on an answer; its text is ``BIG_TEXT`` ``a``\\ s.
- ``endless_event``: an SSE ``data:`` line that never ends (until the client hangs up).
- ``truncated``: a JSON answer whose connection closes halfway through its declared length.
- ``null_id_error``: a JSON-RPC error with a null id (HTTP 200), as a server that could not read the
  request's id answers.
- ``wrong_id``: a JSON answer (HTTP 200) carrying another request's id.
- ``ask_then_sample``: (handshake era) a ``sampling/createMessage`` and a ``roots/list`` request on the call's
  stream; once both are answered, the result ``asked``.

``/dropped/mcp`` lists `DROPPED_PAGES` pages of tools that every client must drop (`_dropped_page`).

``GET /_counts``: how many ``tools/call`` each tool got (``call:NAME``), each method (``method:NAME``) and how
many answers to its own requests the client posted (``answers``).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from collections import Counter
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

COUNTS: Counter[str] = Counter()
SESSIONS: set[str] = set()
ANSWERS: dict[str, asyncio.Future[Any]] = {}
HANDSHAKE = "2025-11-25"
MODERN = "2026-07-28"
BIG = 2 * 1024 * 1024
BIG_TEXT = BIG - 200
DROPPED_PAGES = 40
DROPPED_PER_PAGE = 4
DROPPED_NAME = 1024 * 1024
TOOLS = ["big_sse", "endless_event", "truncated", "null_id_error", "wrong_id", "ask_then_sample"]


def _tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": name, "inputSchema": {"type": "object", "properties": {}}}


def _result(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _text(text: str, modern: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if modern:
        result["resultType"] = "complete"
    return result


def _event(message: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(message)}\n\n".encode()


def _sse(body: Any) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-store"})


class _Truncated(Response):
    """A JSON answer whose connection closes halfway through its declared length."""

    def __init__(self, body: bytes) -> None:
        super().__init__(status_code=200)
        self._body = body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        length = str(len(self._body)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        half = self._body[: len(self._body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})
        raise RuntimeError("the connection drops here")


def _ask_then_sample(rid: Any, modern: bool) -> StreamingResponse:
    loop = asyncio.get_running_loop()
    message = {"role": "user", "content": {"type": "text", "text": "hi"}}
    asks = {
        f"s-{rid}": {"method": "sampling/createMessage", "params": {"messages": [message], "maxTokens": 5}},
        f"r-{rid}": {"method": "roots/list", "params": {}},
    }
    for key in asks:
        ANSWERS[key] = loop.create_future()

    async def asking() -> Any:
        for key, ask in asks.items():
            yield _event({"jsonrpc": "2.0", "id": key, **ask})
        for key in asks:
            await asyncio.wait_for(ANSWERS[key], 30)
            del ANSWERS[key]
        yield _event(_result(rid, _text("asked", modern)))

    return _sse(asking())


def _dropped_page(cursor: str | None) -> dict[str, Any]:
    """A page of `DROPPED_PER_PAGE` tools, each named with `DROPPED_NAME` characters and annotated with an
    invalid ``x-mcp-header`` (so every client must drop it), then the next page's cursor, `DROPPED_PAGES`
    pages in all."""
    page = int(cursor or 0)
    invalid = {"type": "object", "properties": {"q": {"type": "object", "x-mcp-header": "Q"}}}
    tools = [
        {"name": f"{page}-{n}-" + "x" * DROPPED_NAME, "inputSchema": invalid} for n in range(DROPPED_PER_PAGE)
    ]
    listing: dict[str, Any] = {"tools": tools, "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
    if page + 1 < DROPPED_PAGES:
        listing["nextCursor"] = str(page + 1)
    return listing


async def _call(body: dict[str, Any], modern: bool) -> Response:
    rid = body.get("id")
    name = body["params"]["name"]
    COUNTS[f"call:{name}"] += 1
    if name == "big_sse":
        message = _result(rid, _text("a" * BIG_TEXT, modern))

        async def big() -> Any:
            yield _event(message)

        return _sse(big())
    if name == "endless_event":

        async def endless() -> Any:
            yield b'data: {"jsonrpc": "2.0", "id": ' + json.dumps(rid).encode()
            while True:
                yield b', "x": "' + b"a" * 65536 + b'"'
                await asyncio.sleep(0)

        return _sse(endless())
    if name == "truncated":
        return _Truncated(json.dumps(_result(rid, _text("cut", modern))).encode())
    if name == "null_id_error":
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": "internal"}})
    if name == "wrong_id":
        return JSONResponse(_result(f"{rid}-not-mine", _text("not yours", modern)))
    if name == "ask_then_sample":
        return _ask_then_sample(rid, modern)
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "unknown tool"}})


async def mcp(request: Request) -> Response:
    if request.method == "GET":
        return Response(status_code=405)
    if request.method == "DELETE":
        return Response(status_code=200)
    body = json.loads(await request.body())
    method = body.get("method") if isinstance(body, dict) else None
    if method is None:  # an answer to one of the server's requests
        COUNTS["answers"] += 1
        future = ANSWERS.get(str(body.get("id")))
        if future is not None and not future.done():
            future.set_result(body)
        return Response(status_code=202)
    COUNTS[f"method:{method}"] += 1
    rid = body.get("id")
    modern = request.headers.get("mcp-protocol-version") == MODERN
    if method == "initialize":
        result = {
            "protocolVersion": request.path_params.get("version", HANDSHAKE),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "mcx-hostile", "version": "1.0"},
        }
        session = secrets.token_hex(8)
        SESSIONS.add(session)
        return JSONResponse(_result(rid, result), headers={"Mcp-Session-Id": session})
    if method == "server/discover":
        found = {
            "resultType": "complete",
            "supportedVersions": [MODERN],
            "capabilities": {"tools": {}},
            "ttlMs": 0,
            "cacheScope": "private",
        }
        return JSONResponse(_result(rid, found))
    if not modern and (request.headers.get("mcp-session-id") or "") not in SESSIONS:
        error = {"code": -32001, "message": "Session not found"}
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, 404)
    if method.startswith("notifications/"):
        return Response(status_code=202)
    if method == "tools/list" and request.url.path == "/dropped/mcp":
        return JSONResponse(_result(rid, _dropped_page((body.get("params") or {}).get("cursor"))))
    if method == "tools/list":
        listing: dict[str, Any] = {"tools": [_tool(name) for name in TOOLS]}
        if modern:
            listing.update(resultType="complete", ttlMs=0, cacheScope="private")
        return JSONResponse(_result(rid, listing))
    if method == "tools/call":
        return await _call(body, modern)
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})


async def counts(request: Request) -> JSONResponse:
    return JSONResponse(dict(COUNTS))


METHODS = ["GET", "POST", "DELETE"]
app = Starlette(
    routes=[
        Route("/_counts", counts),
        Route("/mcp", mcp, methods=METHODS),
        Route("/v/{version}/mcp", mcp, methods=METHODS),
        Route("/dropped/mcp", mcp, methods=METHODS),
    ]
)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
