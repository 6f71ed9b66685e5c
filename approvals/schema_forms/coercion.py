"""coerce(): HTML form strings -> JSON-typed `content`, with per-field messages.

It converts types only; limits, formats and choices are validate()'s job. clean() does both.

Decisions:
- Every property is assumed to be rendered (fields() describes them all), so a field that is
  absent from the POST means "left empty", not "not shown".
- Booleans: an unticked checkbox sends nothing, and we answer False, required or not. The
  reviewer saw the box and left it unticked, which is an answer; a checkbox has no third
  "no answer" state, and leaving the key out would look like a form that never showed it.
- Empty optional text, numbers, dates and single choices are omitted; empty required ones
  are "This field is required". An empty required multi-select is [] (minItems speaks for
  itself); an empty optional one is omitted.
- Typed text is stripped and CRLF becomes LF (a textarea posts CRLF, which would count double
  against maxLength).
- Date-times without an offset get `tz` (see timezones.py); we never assume UTC.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from typing import Any

from ._common import UnsupportedSchema, _, kind_of, properties, required_names
from .checking import check_schema
from .timezones import to_rfc3339
from .validation import validate

_MISSING = object()
_INTEGER = re.compile(r"[+-]?\d{1,300}")
_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,4})?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TRUE = frozenset({"on", "true", "1", "yes"})
_FALSE = frozenset({"", "off", "false", "0", "no"})

Converted = tuple[Any, str | None]  # (value or _MISSING, error message or None)


def coerce(
    schema: object, data: Any, *, tz: str | None = None, prefix: str = ""
) -> tuple[dict[str, Any], dict[str, str]]:
    """Convert posted strings to `content`. Returns (content, errors by property name).

    `data` is a QueryDict (anything with getlist) or a Mapping of name -> list of strings.
    Keys that are not properties (the CSRF token, buttons, tz) are ignored.
    """
    problems = check_schema(schema)
    if problems:
        raise UnsupportedSchema(problems)
    assert isinstance(schema, dict)
    required = required_names(schema)
    content: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, prop in properties(schema).items():
        value, error = _convert(kind_of(prop), _values(data, prefix + name), name in required, tz)
        if error:
            errors[name] = error
        elif value is not _MISSING:
            content[name] = value
    return content, errors


def clean(
    schema: object, data: Any, *, tz: str | None = None, prefix: str = ""
) -> tuple[dict[str, Any], dict[str, str]]:
    """coerce() then validate(): what a browser form view needs. The first message per field wins."""
    content, errors = coerce(schema, data, tz=tz, prefix=prefix)
    for name, message in validate(schema, content).items():
        errors.setdefault(name, message)
    return content, errors


def _values(data: Any, key: str) -> list[str]:
    if hasattr(data, "getlist"):
        raw = data.getlist(key)
    elif isinstance(data, Mapping):
        raw = data.get(key, [])
    else:
        raise TypeError("form data must be a QueryDict or a mapping of lists")
    if isinstance(raw, str):
        raw = [raw]
    return [str(item) for item in raw or []]


def _convert(kind: str, values: list[str], required: bool, tz: str | None) -> Converted:
    if kind == "boolean":
        return _boolean(values)
    if kind == "multi_select":
        chosen = [value for value in values if value != ""]
        return (chosen if chosen or required else _MISSING), None
    if len(values) > 1:
        return _MISSING, _("Enter only one value")
    raw = values[0] if values else ""
    # A choice is posted exactly as the schema spelled it; only typed text is tidied.
    text = raw if kind == "single_select" else _normalise_text(raw)
    if text == "":
        return _MISSING, (_("This field is required") if required else None)
    return _CONVERTERS.get(kind, _text)(text, tz)


def _normalise_text(value: str) -> str:
    return value.replace("\r\n", "\n").replace("\r", "\n").strip()


def _text(text: str, tz: str | None) -> Converted:
    return text, None


def _boolean(values: list[str]) -> Converted:
    answers = [value.strip().lower() for value in values]
    # Any true value wins, so the "hidden false + checkbox true" template trick works too.
    if any(answer in _TRUE for answer in answers):
        return True, None
    if all(answer in _FALSE for answer in answers):
        return False, None
    return _MISSING, _("Must be true or false")


def _integer(text: str, tz: str | None) -> Converted:
    if not _INTEGER.fullmatch(text):
        return _MISSING, _("Enter a whole number")
    return int(text), None


def _number(text: str, tz: str | None) -> Converted:
    if _INTEGER.fullmatch(text):
        return int(text), None  # exact, even past 2**53
    # A strict grammar: float() alone would also take "nan", "inf" and "1_000".
    if not _DECIMAL.fullmatch(text):
        if "," in text:
            return _MISSING, _("Enter a number, using a point for decimals (1.5)")
        return _MISSING, _("Enter a number")
    number = float(text)
    if number in (float("inf"), float("-inf")):
        return _MISSING, _("Enter a smaller number")
    return number, None


def _date(text: str, tz: str | None) -> Converted:
    if not _DATE.fullmatch(text):
        return _MISSING, _("Enter a date as YYYY-MM-DD, like 2026-12-02")
    try:
        date.fromisoformat(text)
    except ValueError:
        return _MISSING, _("Enter a real date")
    return text, None


def _datetime(text: str, tz: str | None) -> Converted:
    value, error = to_rfc3339(text, tz)
    return (_MISSING, error) if error else (value, None)


_CONVERTERS = {
    "integer": _integer,
    "number": _number,
    "date": _date,
    "datetime": _datetime,
}
