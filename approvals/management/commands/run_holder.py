from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from approvals.holder.process import HolderProcess
from approvals.management.commands._cli import HubCommand, at_least_one
from elicit_hub import heap


class Command(HubCommand):
    help = (
        "Run a holder process: it keeps handshake-era sessions and stdio servers open while people decide. "
        "Run as many as you like; each call is held by exactly one."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--max-calls", type=at_least_one, default=None, help="calls held at once")
        parser.add_argument(
            "--name",
            default=None,
            help="this holder's name (default: host:pid:random). A name still registered by a holder that "
            "was killed is taken over once its heartbeat is stale (ELICIT_HOLDER_STALE)",
        )

    def handle(self, *args: Any, max_calls: int | None, name: str | None, **options: Any) -> None:
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        heap.settle()
        asyncio.run(self._main(HolderProcess(name=name, max_calls=max_calls)))

    async def _main(self, holder: HolderProcess) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, holder.stop)
        await holder.run()
