"""Tool names on the hub's `/mcp` endpoint: `<server-slug>__<tool>`, at most 64 characters.

A name that would be longer keeps its first 55 characters and ends in `_` plus the first 8 hex digits of the
SHA-256 of the whole `<slug>__<tool>` name: stable across restarts and tool list refreshes, and the same in
every process. The hub maps a name back by listing the agent's tools, never by parsing it, so a tool whose
own name holds `__` round-trips too.
"""

from __future__ import annotations

import hashlib

MAX_NAME = 64
SEPARATOR = "__"
_HASH_DIGITS = 8


def gateway_name(slug: str, tool: str) -> str:
    """The name an agent sees on `/mcp` for ``tool`` of the server ``slug``."""
    full = f"{slug}{SEPARATOR}{tool}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:_HASH_DIGITS]
    return f"{full[: MAX_NAME - _HASH_DIGITS - 1]}_{digest}"
