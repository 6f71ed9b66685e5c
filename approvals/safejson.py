"""JSON the hub can store: one strict parse for what arrives, one check for what was parsed elsewhere.

PostgreSQL refuses some values Python's ``json`` accepts, and deep nesting breaks recursive code later
(audit redaction, canonical hashing, templates). Anything that reaches a JSON or text column goes through
`loads` (bodies from outside) or `problem` (values parsed by someone else: an MCP server's answer through
the SDK, form answers). Refused:

- ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON; jsonb has no such number);
- NUL (U+0000) in any string or key (text and jsonb cannot hold it);
- lone surrogates (``"\\ud800"``): not Unicode, so not UTF-8, so not storable;
- nesting deeper than the limit (objects and arrays count one level each).

Pure: no Django, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class Unstorable(ValueError):
    """A value the hub will not store; ``where`` is a JSON-path-like location (``$.arguments.a[0]``)."""

    def __init__(self, reason: str, where: str = "$") -> None:
        super().__init__(f"{reason} at {where}")
        self.reason = reason
        self.where = where


def text_problem(text: str) -> str | None:
    """Why a string cannot be stored (a NUL or a lone surrogate in it), or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone surrogate (not Unicode)"


def storable_text(text: str) -> str:
    """`text` as PostgreSQL can store it: each NUL or lone surrogate replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)


def _reject_constant(name: str) -> Any:
    raise Unstorable(f"{name} is not a JSON number")


def loads(data: bytes | str, *, max_depth: int) -> Any:
    """Parse JSON strictly (see the module's docstring). Raises `Unstorable`, or ValueError if malformed."""
    try:
        value = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise Unstorable(f"nesting deeper than {max_depth} levels") from None
    check(value, max_depth=max_depth)
    return value


def check(value: Any, *, max_depth: int) -> None:
    """Raise `Unstorable` for the first value that cannot be stored; iterative, so any depth is safe."""
    reason = problem(value, max_depth=max_depth)
    if reason is not None:
        raise Unstorable(*reason)


def problem(value: Any, *, max_depth: int) -> tuple[str, str] | None:
    """(reason, where) of the first unstorable part of an already parsed value, or None when it is fine."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "$")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            reason = text_problem(item)
            if reason:
                return reason, where
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{item!r} is not a JSON number", where
        elif isinstance(item, Mapping | list | tuple):
            if depth >= max_depth:
                return f"nesting deeper than {max_depth} levels", where
            if isinstance(item, Mapping):
                for key, child in item.items():
                    label = str(key)
                    reason = text_problem(label)
                    if reason:
                        return f"{reason} in a key", where
                    stack.append((child, depth + 1, f"{where}.{_printable(label)}"))
            else:
                stack.extend((child, depth + 1, f"{where}[{index}]") for index, child in enumerate(item))
    return None


def _printable(key: str) -> str:
    return key if len(key) <= 40 else key[:40] + "..."


def size(value: Any) -> int:
    """The length in bytes of a value as compact JSON (what it costs to store and to send)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace"))
