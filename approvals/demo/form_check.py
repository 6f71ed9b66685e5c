"""Checking a form answer against the `requestedSchema` it answers.

Only the 2026-07-28 restricted subset can appear (flat strings, numbers, booleans and enums), so a
few checks cover it; a general JSON Schema validator would cost the demo seconds of start-up (the
`jsonschema` format extras compile a grammar on import).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any
from urllib.parse import urlsplit

QUOTED_LENGTH = 60


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
        # Floats only: JSON has no NaN nor infinity, but a lenient parser lets them through, and NaN passes
        # any bound. An int is compared as it is: one too large for a float has no float to be turned into.
        if isinstance(value, float) and not math.isfinite(value):
            return "expected a number"
        if kind == "integer" and isinstance(value, float) and not value.is_integer():
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
        return f"{_quoted(value)} is not a valid {fmt}"
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
    return f"{_quoted(wrong[0])} is not one of the choices" if wrong else None


def _quoted(value: str) -> str:
    """The value as the re-asked form quotes it: shortened, since it can be as long as a request body."""
    return repr(value if len(value) <= QUOTED_LENGTH else value[: QUOTED_LENGTH - 3] + "...")


def _bounds(size: float, low: float | None, high: float | None, unit: str) -> str | None:
    if low is not None and size < low:
        return f"must be at least {low}{unit}"
    if high is not None and size > high:
        return f"must be at most {high}{unit}"
    return None


def _is_email(value: str) -> bool:
    return re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", value) is not None


def _is_uri(value: str) -> bool:
    # RFC 3986 has no room for spaces or control characters anywhere in a URI.
    if any(char.isspace() or not char.isprintable() for char in value):
        return False
    parts = urlsplit(value)
    return bool(parts.scheme and (parts.netloc or parts.path))


# RFC 3339 `full-date` and `date-time` exactly: Python's fromisoformat also takes week dates ("2026-W01-1"),
# ordinal dates, the basic format and times without seconds, none of which the formats allow.
_FULL_DATE = r"(\d{4})-(\d{2})-(\d{2})"
_DATE = re.compile(_FULL_DATE, re.ASCII)
_DATE_TIME = re.compile(
    _FULL_DATE + r"[Tt](\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))", re.ASCII
)


def _is_date(value: str) -> bool:
    match = _DATE.fullmatch(value)
    return match is not None and _real_date(*match.groups())


def _is_date_time(value: str) -> bool:
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        return False
    year, month, day, hour, minute, second, offset_hour, offset_minute = match.groups()
    return (
        _real_date(year, month, day)
        and int(hour) <= 23
        and int(minute) <= 59
        and int(second) <= 60  # a leap second
        and int(offset_hour or 0) <= 23
        and int(offset_minute or 0) <= 59
    )


def _real_date(year: str, month: str, day: str) -> bool:
    try:
        date(int(year), int(month), int(day))
    except ValueError:
        return False
    return True


_FORMATS: dict[str, Callable[[str], bool]] = {
    "email": _is_email,
    "uri": _is_uri,
    "date": _is_date,
    "date-time": _is_date_time,
}
