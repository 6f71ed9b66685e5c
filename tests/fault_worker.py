"""A Celery worker for the crash tests: the real one, with a pause injected before each send to an MCP server.

    ELICIT_TEST_PAUSE_BEFORE_SEND=30 python -m tests.fault_worker -A elicit_hub worker --pool=solo ...

The pause falls after the send is claimed (committed) and before the request leaves, so a test can kill
the worker at that moment. Production code has no such hook: the pause wraps the MCP client's ``run``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def pause_before_each_send(seconds: float) -> None:
    from approvals import mcp_client

    run = mcp_client.run

    def paused_run(awaitable: Any) -> Any:
        time.sleep(seconds)
        return run(awaitable)

    mcp_client.run = paused_run  # type: ignore[assignment]


def main() -> None:
    pause = float(os.environ.get("ELICIT_TEST_PAUSE_BEFORE_SEND") or 0)
    if pause:
        pause_before_each_send(pause)
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
