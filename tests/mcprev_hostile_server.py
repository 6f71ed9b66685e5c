"""A quirky handshake-era MCP server over Streamable HTTP, written by hand (run as a subprocess).

    python tests/mcprev_hostile_server.py PORT

It speaks just enough of MCP 2025-11-25 (``initialize``, ``Mcp-Session-Id``, ``tools/list``, ``tools/call``)
to misbehave in the ways real servers and proxies do. ``tools/call`` by tool name:

- ``ok``: an SSE answer with comments, a ``retry:`` field, an event id and its JSON split over several
  ``data:`` lines; the result text is ``ok``.
- ``vanish``: an SSE stream that sends a progress notification, then ends without the response.
- ``expire``: the session expires: HTTP 404 with error -32001 ``Session not found`` (what the TypeScript SDK
  answers) to the ``tools/call`` POST, every time.
- ``expire_400``: the session expires as server-everything (the TypeScript SDK) says so: HTTP 400 with an
  error that has no ``id`` (``Bad Request: No valid session ID provided``).
- ``expire_once``: the same the first time it is called; on the next session it runs (``ran:expire_once``).
- ``accepted``: HTTP 202 with no body to the ``tools/call`` POST.
- ``ask_vanish``: ``elicitation/create`` on the call's stream, then the stream ends without the response.
- ``broken``: HTTP 200 JSON that is not JSON-RPC.
- ``wrong_id``: a response carrying another id, then the stream ends.
- ``gzipped`` / ``deflated``: a small answer, gzip-compressed / a raw deflate stream; its text: ``packed``.
- ``bomb``: a gzip-compressed JSON answer of ``BOMB`` bytes once decompressed (well under a megabyte sent).

``GET /_counts``: how many ``tools/call`` each tool got (``call:NAME``) and each method (``method:NAME``).
"""

from __future__ import annotations

import gzip
import json
import secrets
import sys
import zlib
from collections import Counter
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

COUNTS: Counter[str] = Counter()
SESSIONS: set[str] = set()
VERSION = "2025-11-25"
TOOLS = [
    "ok",
    "vanish",
    "expire",
    "expire_400",
    "expire_once",
    "accepted",
    "ask_vanish",
    "broken",
    "wrong_id",
    "bomb",
]
BOMB = 64 * 1024 * 1024


def _tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": name, "inputSchema": {"type": "object", "properties": {}}}


def _sse(*events: str) -> StreamingResponse:
    async def body() -> Any:
        for event in events:
            yield event.encode()

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


def _session_not_found() -> JSONResponse:
    return JSONResponse(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "Session not found"}}, 404
    )


def _event(message: dict[str, Any]) -> str:
    return f"data: {json.dumps(message)}\n\n"


def _result(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


async def mcp(request: Request) -> Response:
    if request.method == "GET":
        return Response(status_code=405)
    if request.method == "DELETE":
        return Response(status_code=200)
    body = json.loads(await request.body())
    method = body.get("method") if isinstance(body, dict) else None
    if method is None:  # a response (an elicitation's answer) or a batch
        COUNTS["answers"] += 1
        return Response(status_code=202)
    COUNTS[f"method:{method}"] += 1
    rid = body.get("id")
    if method == "initialize":
        result = {
            "protocolVersion": VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "mcprev-hostile", "version": "1.0"},
        }
        session = secrets.token_hex(8)
        SESSIONS.add(session)
        return JSONResponse(_result(rid, result), headers={"Mcp-Session-Id": session})
    session = request.headers.get("mcp-session-id") or ""
    if session not in SESSIONS:
        return _session_not_found()
    if method.startswith("notifications/"):
        return Response(status_code=202)
    if method == "tools/list":
        return JSONResponse(_result(rid, {"tools": [_tool(name) for name in TOOLS]}))
    if method != "tools/call":
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
    name = body["params"]["name"]
    COUNTS[f"call:{name}"] += 1
    token = (body["params"].get("_meta") or {}).get("progressToken")
    progress = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": 1, "total": 2},
    }
    if name == "ok":
        lines = json.dumps(_result(rid, _text("ok")), indent=1).splitlines()
        split = "".join(f"data: {line}\n" for line in lines)
        return _sse(
            ": a comment\n\n", "retry: 1000\n\n", _event(progress), f"id: e1\nevent: message\n{split}\n"
        )
    if name == "vanish":
        return _sse(": working\n\n", _event(progress))
    if name == "expire" or (name == "expire_once" and COUNTS[f"call:{name}"] == 1):
        SESSIONS.discard(session)
        return _session_not_found()
    if name == "expire_400":
        SESSIONS.discard(session)
        refusal = {"code": -32000, "message": "Bad Request: No valid session ID provided"}
        return JSONResponse({"jsonrpc": "2.0", "error": refusal}, 400)
    if name == "expire_once":
        COUNTS["ran:expire_once"] += 1
        return JSONResponse(_result(rid, _text("ran")))
    if name == "accepted":
        return Response(status_code=202)
    if name == "ask_vanish":
        ask = {
            "jsonrpc": "2.0",
            "id": "ask-1",
            "method": "elicitation/create",
            "params": {
                "message": "Go?",
                "requestedSchema": {"type": "object", "properties": {"go": {"type": "boolean"}}},
            },
        }
        return _sse(_event(ask))
    if name == "broken":
        return JSONResponse({"hello": "world"})
    if name in ("gzipped", "deflated"):
        plain = json.dumps(_result(rid, _text("packed"))).encode()
        if name == "gzipped":
            packed, coding = gzip.compress(plain), "gzip"
        else:
            squeezer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
            packed, coding = squeezer.compress(plain) + squeezer.flush(), "deflate"
        return Response(packed, media_type="application/json", headers={"Content-Encoding": coding})
    if name == "bomb":
        head = json.dumps(_result(rid, _text("")))
        cut = head.index('"text": ""') + len('"text": "')
        body = head[:cut].encode() + b"a" * (BOMB - len(head)) + head[cut:].encode()
        return Response(
            gzip.compress(body, 9), media_type="application/json", headers={"Content-Encoding": "gzip"}
        )
    if name == "wrong_id":
        return _sse(_event(_result(f"{rid}-not-mine", _text("not yours"))))
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "unknown tool"}})


async def counts(request: Request) -> JSONResponse:
    return JSONResponse(dict(COUNTS))


app = Starlette(routes=[Route("/_counts", counts), Route("/mcp", mcp, methods=["GET", "POST", "DELETE"])])


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
