"""defaults(): the answer "accept with defaults" sends (used by the conformance adapter).

Every default the server gave, plus, for required fields without one, a plausible value that
passes validate(): first choice, the minimum, False, "x" padded to minLength, a valid email,
today's date... Optional fields without a default are left out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ._common import UnsupportedSchema, choices_of, kind_of, properties, required_names
from .checking import check_schema


def defaults(schema: object, *, now: datetime | None = None) -> dict[str, Any]:
    """Defaults plus made-up values for required fields; `now` fixes dates (default: now, UTC)."""
    problems = check_schema(schema)
    if problems:
        raise UnsupportedSchema(problems)
    assert isinstance(schema, dict)
    moment = now or datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    required = required_names(schema)
    content: dict[str, Any] = {}
    for name, prop in properties(schema).items():
        if prop.get("default") is not None:  # null: no default (see checking)
            content[name] = copy.deepcopy(prop["default"])
        elif name in required:
            content[name] = plausible_value(prop, moment)
    return content


def plausible_value(prop: dict[str, Any], moment: datetime) -> Any:
    """A value that satisfies the checked property `prop`."""
    kind = kind_of(prop)
    if kind == "boolean":
        return False
    if kind in ("number", "integer"):
        return _number(prop, kind == "integer")
    if kind == "single_select":
        return choices_of(prop)[0][0]
    if kind == "multi_select":
        return [value for value, _label in choices_of(prop)[: prop.get("minItems", 0)]]
    if kind == "date":
        return moment.date().isoformat()
    if kind == "datetime":
        whole = moment.replace(microsecond=0)
        zulu = whole.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
        return _fit(prop, [whole.isoformat(), zulu], _pad_fraction)
    if kind == "email":
        return _fit(prop, ["user@example.com", "a@example.com", "a@b.co"], _pad_email)
    if kind == "url":
        return _fit(prop, ["https://example.com/", "https://a.co", "a:b", "a:"], _pad_end)
    return _fit(prop, ["x", ""], _pad_end)


def _number(prop: dict[str, Any], whole: bool) -> int | float:
    low, high = prop.get("minimum"), prop.get("maximum")
    if whole:
        low = math.ceil(low) if low is not None else None
        high = math.floor(high) if high is not None else None
    value: int | float = 0
    if low is not None and value < low:
        value = low
    if high is not None and value > high:
        value = high
    return value


def _fit(prop: dict[str, Any], candidates: list[str], pad: Callable[[str, int], str]) -> str:
    """The first candidate that, padded up to minLength, is within maxLength."""
    low, high = prop.get("minLength", 0), prop.get("maxLength")
    padded = [
        pad(candidate, low - len(candidate)) if low > len(candidate) else candidate
        for candidate in candidates
    ]
    fitting = [value for value in padded if high is None or len(value) <= high]
    return fitting[0] if fitting else padded[-1]


def _pad_end(value: str, count: int) -> str:
    return value + "x" * count


def _pad_fraction(value: str, count: int) -> str:
    """A date-time made longer with a fraction of a second: "10:30:00" + ".000" (a fraction is 2 or more)."""
    seconds_end = len("2026-12-02T10:30:00")
    return f"{value[:seconds_end]}.{'0' * max(count - 1, 1)}{value[seconds_end:]}"


def _pad_email(value: str, count: int) -> str:
    local, domain = value.split("@", 1)
    return f"{local}{'x' * count}@{domain}"
