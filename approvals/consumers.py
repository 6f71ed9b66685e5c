"""Websocket consumers: authenticate on connect, re-check permission per event, never write."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer


class QueueConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.accept()
