"""The MCP server of the load benchmark: the demo server, plus a record of when each retry arrived.

The demo's ``create_deployment(branch)`` answers ``input_required`` (which environment?) on the first
``tools/call`` and completes on the retry that carries the answer. This wraps the demo's whole ASGI app and
notes, for every ``tools/call`` that carries ``inputResponses``, the wall-clock time (this machine) its
request arrived, keyed by the ``branch`` argument. ``GET /retries`` returns ``{branch: unix time}``.

    python bench/load_server.py --port PORT      (http://127.0.0.1:PORT/mcp, stateless, 2026-07-28)
"""

from __future__ import annotations

import argparse
import json
import socket
import time

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from approvals.demo._asgi import buffer_body, is_mcp_post, tool_call
from approvals.demo.server import build_app

RETRIES: dict[str, float] = {}


class RecordRetries:
    """Pure ASGI: stamp each retry's arrival before the demo app sees it; serve ``GET /retries``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/retries":
            body = json.dumps(RETRIES).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if is_mcp_post(scope):
            arrived = time.time()
            receive = await buffer_body(scope, receive)
            params = tool_call(scope)
            if params and params.get("inputResponses"):
                branch = str((params.get("arguments") or {}).get("branch"))
                RETRIES.setdefault(branch, arrived)
        await self.app(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    sock = socket.create_server((args.host, args.port))
    # As the demo does: without it small writes wait on the client's delayed ACK (~40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    config = uvicorn.Config(
        RecordRetries(build_app(host=args.host)),
        log_level="warning",
        backlog=4096,
        timeout_graceful_shutdown=2,
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
