"""Pages of the gateway's `tools/list`: MCP's `cursor` / `nextCursor`, in every protocol era.

An agent with many servers of many tools would otherwise get all of them in one response. A page holds at
most ELICIT_GATEWAY_PAGE_SIZE tools, in one fixed order (`catalog.position`: by server slug, then by the name
the agent sees), and its `nextCursor` names the position of its last tool. The next page starts after that
position, whatever was added or removed meanwhile: a walk never shows a tool twice, and skips none that was
there all along (a tool added before the position meanwhile is in the next walk).

The cursor is opaque to the client and signed (HMAC, keyed from SECRET_KEY) for the agent and the endpoint
(`/mcp` or `/mcp/<slug>`) it was given for: one that is over MAX_CURSOR characters, altered, made with another
secret, or given to another agent or for another endpoint is refused with JSON-RPC -32602, as the
specification asks of an invalid cursor, before anything is read.
"""

from __future__ import annotations

import mcp_types as types
from django.conf import settings
from django.core import signing
from mcp.shared.exceptions import MCPError

from approvals.gateway.catalog import Position

MAX_CURSOR = 2048  # characters; a cursor the hub gives is well under 1,600
INVALID_CURSOR = "invalid_cursor"  # the error's data.reason


def page_size() -> int:
    """Tools per page (ELICIT_GATEWAY_PAGE_SIZE, default 100)."""
    return int(settings.ELICIT_GATEWAY_PAGE_SIZE)


def _signer(agent_id: int, slug: str | None) -> signing.Signer:
    # The agent and the endpoint are in the key, not in the cursor: it names neither, and fits only them.
    return signing.Signer(salt=f"approvals.gateway.tools-cursor:{agent_id}:{slug or ''}")


def cursor_for(position: Position, agent_id: int, slug: str | None) -> str:
    """The cursor of the page after ``position``, for this agent on this endpoint."""
    return _signer(agent_id, slug).sign_object(list(position))


def position_of(cursor: str, agent_id: int, slug: str | None) -> Position:
    """The position a cursor this hub gave this agent on this endpoint names; any other is -32602."""
    found: object = None
    if len(cursor) <= MAX_CURSOR:
        try:
            found = _signer(agent_id, slug).unsign_object(cursor)
        except (signing.BadSignature, ValueError):  # altered, another secret, agent or endpoint
            found = None
    if isinstance(found, list) and len(found) == 3 and all(isinstance(part, str) for part in found):
        return (found[0], found[1], found[2])
    raise MCPError(
        types.INVALID_PARAMS,
        "This cursor is not one this hub gave this agent for this tool list: list the tools again without "
        "a cursor.",
        {"reason": INVALID_CURSOR},
    )
