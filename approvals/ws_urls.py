"""Websocket URL routes (served by Channels under Daphne). Any other address is refused (``NotFound``):
Channels' router would otherwise raise, and log a traceback, for every such attempt."""

from django.urls import path, re_path

from approvals import consumers

websocket_urlpatterns = [
    path("ws/queue/", consumers.QueueConsumer.as_asgi()),
    re_path(r"", consumers.NotFound.as_asgi()),
]
