"""Tool names on the hub's `/mcp` endpoint: `<server-slug>__<tool>`, at most 64 characters.

A name that would be longer keeps its first 55 characters and ends in `_` plus the first 8 hex digits of the
SHA-256 of the whole `<slug>__<tool>` name: stable across restarts and tool list refreshes, and the same in
every process. The hub maps a name back by listing the agent's tools, never by parsing it, so a tool whose
own name holds `__` round-trips too.

A server's slug may not hold `__` nor end in `_` (`approvals.models.validate_server_slug`): the first `__` of
a name then ends the slug, and no two servers' tools take the same name. A server registered before that
rule keeps its slug; `catalog.exposed_tools` leaves out a name two of its tools would share.
"""

from __future__ import annotations

import hashlib

from approvals.models import SEPARATOR

MAX_NAME = 64
_HASH_DIGITS = 8


def gateway_name(slug: str, tool: str) -> str:
    """The name an agent sees on `/mcp` for ``tool`` of the server ``slug``."""
    full = f"{slug}{SEPARATOR}{tool}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:_HASH_DIGITS]
    return f"{full[: MAX_NAME - _HASH_DIGITS - 1]}_{digest}"
