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
        if "default" in prop:
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
        return moment.replace(microsecond=0).isoformat()
    if kind == "email":
        return _fit(prop, ["user@example.com", "a@example.com", "a@b.co"], _pad_email)
    if kind == "url":
        return _fit(prop, ["https://example.com/", "https://a.co", "a:b"], _pad_end)
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
    """The first candidate within maxLength, padded up to minLength."""
    high = prop.get("maxLength")
    fitting = [candidate for candidate in candidates if high is None or len(candidate) <= high]
    value = fitting[0] if fitting else candidates[-1]
    missing = prop.get("minLength", 0) - len(value)
    return pad(value, missing) if missing > 0 else value


def _pad_end(value: str, count: int) -> str:
    return value + "x" * count


def _pad_email(value: str, count: int) -> str:
    local, domain = value.split("@", 1)
    return f"{local}{'x' * count}@{domain}"
