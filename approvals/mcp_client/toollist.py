"""The one rule for every tool list the hub reads from a server: what it keeps, and when it stops asking.

Every path that lists tools follows it: the probe, a refresh, the listing before a send, and a list read on
a session after ``notifications/tools/list_changed``. A server answers ``tools/list`` a page at a time,
each up to the response cap, and a hostile one can page without end, or name a cursor it named before
(its pages loop). The hub keeps at most `MAX_TOOLS` tools and `MAX_TOOLS_BYTES` of them as JSON (one JSONB
column holds the list), stops paging once the list is full or a cursor comes round again, and marks the
list ``truncated``. It keeps the first tools rather than refusing the whole list:
calls to those still work, and the rest are a hostile server's problem, not the hub's. Tools PostgreSQL
cannot store (a NUL or a lone surrogate anywhere, absurd nesting: `approvals.safejson`) are left out one
by one, so the write never fails; so is a tool longer than `MAX_TOOL_BYTES` as JSON (`oversized`), which
would otherwise fill the list on its own and leave out every tool after it. Past `MAX_OVERSIZED_BYTES` of
those the list is truncated as well: a server listing nothing but huge tools is not read page after page.

A tool is known by its name (a call names it; the SDK's session keeps one header map and one output schema
per name). A name listed again, on the same page or a later one, is the first definition's: the later ones
are dropped and counted (`duplicates`), so that routing, the gateway, the admin and a send all read the one
definition, never one here and another there.

Pure: no Django.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from approvals import safejson
from approvals.mcp_client.wire import MAX_DEPTH

MAX_TOOL_PAGES = 100
MAX_TOOLS = 2_000
MAX_TOOLS_BYTES = 4 * 1024 * 1024  # the kept tools as compact JSON
MAX_TOOL_BYTES = 256 * 1024  # one tool as compact JSON
MAX_OVERSIZED_BYTES = 4 * MAX_TOOLS_BYTES  # of tools left out as oversized, before the list is truncated
MAX_NAMED = 50  # tool names an audit event lists
MAX_NAME = 128  # characters of each (MCP's own limit on a tool name)


class ToolList(list[dict[str, Any]]):
    """The tools kept from one listing, in the server's order: a plain list (stored as it is), which
    also says what was left out. `truncated`: the server listed more than the hub keeps (tools, bytes or
    pages, or its pages looped). `unstorable`: how many tools were left out because they cannot be stored;
    `oversized`: how many because one alone is longer than `MAX_TOOL_BYTES`. `duplicates`: how many
    were left out because a tool of the same name was kept before them (`duplicated`: the first
    `MAX_NAMED` of those names).

    Copies and slices are plain lists: only the listing that applied the rule carries the marks."""

    def __init__(self) -> None:
        super().__init__()
        self.truncated = False
        self.unstorable = 0
        self.oversized = 0
        self._oversized_bytes = 0
        self.duplicates = 0
        self.duplicated: list[str] = []
        self.size = 0
        self._names: set[str] = set()
        self._cursors: set[bytes] = set()

    @property
    def full(self) -> bool:
        return self.truncated or len(self) >= MAX_TOOLS

    def offer(self, tool: dict[str, Any]) -> bool:
        """Keep `tool` if it can be stored, fits and names no tool kept already; False once the list is full
        (stop reading)."""
        if self.truncated:
            return False
        name = tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str) and name in self._names:
            self.duplicates += 1
            if len(self.duplicated) < MAX_NAMED and name[:MAX_NAME] not in self.duplicated:
                self.duplicated.append(name[:MAX_NAME])
            return True
        if safejson.problem(tool, max_depth=MAX_DEPTH) is not None:
            self.unstorable += 1
            return True
        cost = safejson.size(tool)
        if cost > MAX_TOOL_BYTES:
            self.oversized += 1
            self._oversized_bytes += cost
            if self._oversized_bytes > MAX_OVERSIZED_BYTES:
                self.truncated = True
                return False
            return True
        if len(self) >= MAX_TOOLS or self.size + cost > MAX_TOOLS_BYTES:
            self.truncated = True
            return False
        self.append(tool)
        self.size += cost
        if isinstance(name, str):
            self._names.add(name)
        return True

    def more(self, cursor: str | None, pages: int) -> bool:
        """After `pages` pages, the last naming `cursor`: whether to ask for the next one. A list full
        already, past `MAX_TOOL_PAGES`, or whose `cursor` was named before (the next page would be one read
        already, and so on without end) is truncated instead (the server had more to say)."""
        if not cursor:
            return False
        seen = hashlib.sha256(cursor.encode("utf-8", "surrogatepass")).digest()
        if self.full or pages >= MAX_TOOL_PAGES or seen in self._cursors:
            self.truncated = True
            return False
        self._cursors.add(seen)
        return True

    def summary(self) -> dict[str, Any]:
        """For an audit event: how many tools, the first `MAX_NAMED` names, whether it was truncated, and what
        was left out (an event stays small however many tools a server lists)."""
        names = [str(tool.get("name"))[:MAX_NAME] for tool in self[:MAX_NAMED]]
        return {
            "tool_count": len(self),
            "tools": names,
            "truncated": self.truncated,
            "unstorable": self.unstorable,
            "oversized": self.oversized,
            "duplicates": self.duplicates,
            "duplicated": list(self.duplicated),
        }


def duplicates(tools: Any) -> int:
    """How many tools a listing left out as names listed again (0 for a list that applied no rule)."""
    return tools.duplicates if isinstance(tools, ToolList) else 0


def bounded(tools: Iterable[dict[str, Any]]) -> ToolList:
    """`tools` under the rule: a `ToolList` as it is; any other list (read elsewhere) checked tool by tool."""
    if isinstance(tools, ToolList):
        return tools
    kept = ToolList()
    for tool in tools:
        if not kept.offer(tool):
            break
    return kept


__all__ = [
    "MAX_TOOLS",
    "MAX_TOOLS_BYTES",
    "MAX_TOOL_BYTES",
    "MAX_TOOL_PAGES",
    "ToolList",
    "bounded",
    "duplicates",
]
