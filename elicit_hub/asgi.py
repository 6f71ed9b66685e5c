"""ASGI entry point: HTTP through Django, websockets through Channels (origin-checked, authenticated)."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")
django.setup(set_prefix=False)  # what get_asgi_application() does, before its handler is made

from elicit_hub.handler import HubASGIHandler  # noqa: E402

django_asgi_app = HubASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry loaded)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from approvals.ws_urls import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
