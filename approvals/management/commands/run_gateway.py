from __future__ import annotations

from typing import Any

import uvicorn
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Serve the MCP gateway (/mcp and /mcp/<server-slug>) under uvicorn, beside Daphne. Handshake-era "
        "sessions live in the process that opened them: behind a proxy, pin each Mcp-Session-Id to one."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001)

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        from elicit_hub import heap
        from elicit_hub.gateway_asgi import application

        heap.settle()
        uvicorn.run(
            application,
            host=host,
            port=port,
            access_log=False,  # paths only, but a proxy's log is the place for them
            timeout_graceful_shutdown=5,
            lifespan="on",
        )
