"""Websocket URL routes (served by Channels under Daphne)."""

from django.urls import path

from approvals import consumers

websocket_urlpatterns = [
    path("ws/queue/", consumers.QueueConsumer.as_asgi()),
]
