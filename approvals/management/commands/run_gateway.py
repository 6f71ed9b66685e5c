from __future__ import annotations

from typing import Any

import uvicorn

from approvals.management.commands._cli import HubCommand, port
from elicit_hub.door import json_error
from elicit_hub.serve_api import HeadLimitedProtocol


class GatewayProtocol(HeadLimitedProtocol):
    """The API server's httptools protocol: a request head over ``MAX_HEAD`` bytes is answered 431, not
    collected (httptools alone would buffer an endless header before the guard sees the token). Its
    refusals are JSON on every path, like the gateway's other errors: its clients are programs."""

    def _answer(self, code: str, title: str, message: str) -> tuple[bytes, bytes]:
        return json_error(code, message)


class Command(HubCommand):
    help = (
        "Serve the MCP gateway (/mcp and /mcp/<server-slug>) under uvicorn, beside Daphne. Handshake-era "
        "sessions live in the process that opened them: behind a proxy, pin each Mcp-Session-Id to one."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=port, default=8001)

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        from elicit_hub import heap
        from elicit_hub.gateway_asgi import application

        heap.settle()
        uvicorn.run(
            application,
            host=host,
            port=port,
            http=GatewayProtocol,
            access_log=False,  # paths only, but a proxy's log is the place for them
            timeout_graceful_shutdown=5,
            lifespan="on",
        )
