"""Tool names on the hub's `/mcp` endpoint: `<server-slug>__<tool>`, at most 64 characters, of the characters
MCP allows in a tool name (A-Z, a-z, 0-9, `_`, `-`, `.`).

A name that would be longer keeps its first 55 characters and ends in `_` plus the first 8 hex digits of the
SHA-256 of the whole `<slug>__<tool>` name: stable across restarts and tool list refreshes, and the same in
every process. A name holding any other character (an upstream's tool named with spaces, accents, another
script, or a newline carrying words for the model) has each of them replaced by `_` and ends in the same
hash, so it stays distinct from the tool whose name is that replacement. The hub maps a name back by naming
the tools of the servers whose `name_prefix` begins it (`catalog.find_tool`), never by parsing it, so a tool
whose own name holds `__` round-trips too.

A server's slug may not hold `__` nor end in `_` (`approvals.models.validate_server_slug`): the first `__` of
a name then ends the slug, and no two servers' tools take the same name. A server registered before that
rule keeps its slug; `catalog.exposed_tools` leaves out a name two of its tools would share.
"""

from __future__ import annotations

import hashlib
import re

from approvals.models import SEPARATOR

MAX_NAME = 64
MAX_SHOWN = 128  # characters of a name from a client that an error repeats (MCP's own limit on a tool name)
_HASH_DIGITS = 8
_OTHER = re.compile(r"[^A-Za-z0-9._-]")  # what MCP does not allow in a tool name (SEP-986)
_HASHED = re.compile(rf"_[0-9a-f]{{{_HASH_DIGITS}}}\Z")  # how a cut or mended name ends


def gateway_name(slug: str, tool: str) -> str:
    """The name an agent sees on `/mcp` for ``tool`` of the server ``slug``."""
    full = f"{slug}{SEPARATOR}{tool}"
    safe = _OTHER.sub("_", full)
    if len(full) <= MAX_NAME and safe == full:
        return full
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:_HASH_DIGITS]
    return f"{safe[: MAX_NAME - _HASH_DIGITS - 1]}_{digest}"


def name_prefix(slug: str) -> str:
    """What every name `gateway_name` gives a tool of the server ``slug`` starts with (a name that does not
    start with it names none of that server's tools)."""
    return (_OTHER.sub("_", slug) + SEPARATOR)[: MAX_NAME - _HASH_DIGITS - 1]


def plain_tool(slug: str, name: str) -> str | None:
    """The one tool of ``slug`` that `gateway_name` names ``name`` without a hash, if any could; a name that
    ends like a hash may also name other tools of that server (`may_be_hashed`)."""
    start = f"{slug}{SEPARATOR}"
    return name[len(start) :] if name.startswith(start) else None


def may_be_hashed(name: str) -> bool:
    """Whether ``name`` has the shape of a name `gateway_name` cut or mended (it ends in `_` and the hash)."""
    return len(name) <= MAX_NAME and _HASHED.search(name) is not None


def shown(name: str) -> str:
    """A name a client sent, as an error message repeats it: at most `MAX_SHOWN` characters of it (a request
    body may hold a megabyte of name), saying how long it was when cut."""
    return name if len(name) <= MAX_SHOWN else f"{name[:MAX_SHOWN]}… ({len(name)} characters)"
