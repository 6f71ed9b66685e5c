"""One outcome per call: a `requestState` of a call that already ended is refused.

The SDK's seal proves the demo minted a state for this tool and these arguments, but not that it is used
once: within its TTL a copied state would run the tool again (a second deployment, or a staging deployment
after the reviewer declined production). Every state a round mints names its call (`rounds.CHAIN`); once
a round of that call ends with a final result, any state of that call is refused as the SDK refuses a
forged one, and so is a second round of the same call while the first is still running.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, NoReturn

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.methods import INPUT_REQUIRED_METHODS, is_input_required

from approvals.demo.rounds import chain_of

logger = logging.getLogger("approvals.demo")


class OneOutcome:
    """SDK server middleware, inside the SDK's `RequestStateBoundary` (it reads the verified plaintext).

    An ended call is remembered for `ttl` seconds after it ended: every state of it was sealed before
    then, so the seal's own expiry refuses it afterwards. In memory, as the demo keeps all its state; a
    restart forgets it (the idempotency cache too).
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._running: set[str] = set()

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        chain = (
            chain_of((ctx.params or {}).get("requestState")) if ctx.method in INPUT_REQUIRED_METHODS else None
        )
        if chain is None:
            return await call_next(ctx)
        self._forget_expired()
        if chain in self._ended:
            _refuse(ctx.method, "its call has ended")
        if chain in self._running:
            _refuse(ctx.method, "another round of its call is running")
        self._running.add(chain)
        try:
            result = await call_next(ctx)
        finally:
            self._running.discard(chain)
        if not is_input_required(result):
            self._ended[chain] = time.monotonic()
        return result

    def _forget_expired(self) -> None:
        horizon = time.monotonic() - self.ttl
        while self._ended and next(iter(self._ended.values())) < horizon:
            self._ended.popitem(last=False)


def _refuse(method: str, reason: str) -> NoReturn:
    # The SDK's wire error for a state that fails verification; the reason goes to the log only.
    logger.warning("requestState refused on %s: %s", method, reason)
    raise MCPError(
        code=INVALID_PARAMS,
        message="Invalid or expired requestState",
        data={"reason": "invalid_request_state"},
    )
