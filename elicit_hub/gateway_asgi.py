"""ASGI entry point of the MCP gateway (`/mcp`, `/mcp/<server-slug>`): its own process beside Daphne.

Daphne has no lifespan support and the MCP SDK's session manager needs its run loop, so the gateway runs
under uvicorn: `uvicorn elicit_hub.gateway_asgi:application` (`make run` starts it; see the README for the
reverse proxy in front of both).
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")
django.setup()

from approvals.gateway.server import build_app  # noqa: E402  (needs the app registry loaded)

application = build_app()
