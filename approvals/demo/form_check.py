"""Checking a form answer against the `requestedSchema` it answers.

Only the 2026-07-28 restricted subset can appear (flat strings, numbers, booleans and enums), so a
few checks cover it; a general JSON Schema validator would cost the demo seconds of start-up (the
`jsonschema` format extras compile a grammar on import).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any
from urllib.parse import urlsplit


def schema_problem(content: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """The first way `content` breaks `schema`, in words for a reviewer, or None. Unknown keys are ignored."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if content.get(name) is None:
            return f"{name}: a value is required"
    for name, prop in properties.items():
        value = content.get(name)
        problem = None if value is None else _field_problem(value, prop)
        if problem:
            return f"{name}: {problem}"
    return None


def _field_problem(value: Any, prop: Mapping[str, Any]) -> str | None:
    kind = prop.get("type")
    if kind == "boolean":
        return None if isinstance(value, bool) else "expected true or false"
    if kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "expected a number"
        if kind == "integer" and not float(value).is_integer():
            return "expected a whole number"
        return _bounds(value, prop.get("minimum"), prop.get("maximum"), "")
    if kind == "array":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return "expected a list of choices"
        return _choice_problem(value, _choices(prop.get("items", {}))) or _bounds(
            len(value), prop.get("minItems"), prop.get("maxItems"), " choices"
        )
    if not isinstance(value, str):
        return "expected text"
    fmt = prop.get("format")
    if fmt in _FORMATS and not _FORMATS[fmt](value):
        return f"{value!r} is not a valid {fmt}"
    return _choice_problem([value], _choices(prop)) or _bounds(
        len(value), prop.get("minLength"), prop.get("maxLength"), " characters"
    )


def _choices(prop: Mapping[str, Any]) -> set[str] | None:
    if "enum" in prop:
        return set(prop["enum"])
    options = prop.get("oneOf") or prop.get("anyOf")
    return {option["const"] for option in options} if options else None


def _choice_problem(values: list[str], allowed: set[str] | None) -> str | None:
    wrong = [value for value in values if allowed is not None and value not in allowed]
    return f"{wrong[0]!r} is not one of the choices" if wrong else None


def _bounds(size: float, low: float | None, high: float | None, unit: str) -> str | None:
    if low is not None and size < low:
        return f"must be at least {low}{unit}"
    if high is not None and size > high:
        return f"must be at most {high}{unit}"
    return None


def _is_email(value: str) -> bool:
    return re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", value) is not None


def _is_uri(value: str) -> bool:
    parts = urlsplit(value)
    return bool(parts.scheme and (parts.netloc or parts.path))


def _is_date(value: str) -> bool:
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return len(value) == 10


def _is_date_time(value: str) -> bool:
    # RFC 3339: a full date, a "T", a time and an explicit offset.
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return False
    return "T" in value.upper() and moment.tzinfo is not None


_FORMATS: dict[str, Callable[[str], bool]] = {
    "email": _is_email,
    "uri": _is_uri,
    "date": _is_date,
    "date-time": _is_date_time,
}
