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
  itself); an empty optional one is omitted, unless the server suggested options: then the
  reviewer unticked them, which is an answer, [] (when minItems allows it). Left out, a server
  that fills missing fields from its defaults would read the very options taken back. Plain
  text the server suggested and the reviewer emptied (posted empty) is "" for the same reason
  (when minLength allows it; an empty date, number or address is no valid value, and is omitted).
  A required text field whose suggested value is "" itself may be left blank: it answers "".
- Typed text is stripped and CRLF becomes LF (a textarea posts CRLF, which would count double
  against maxLength). Text left as the server's default had it (line breaks aside, which a browser
  sends as CRLF) is sent as the server wrote it: tidying it would change the server's own value.
  So is an email address left as suggested, which a browser sends with an international domain in
  punycode (ops@bücher.example as ops@xn--bcher-kva.example).
- A typed web address with letters beyond ASCII is sent as the URI it stands for (the domain in
  punycode, the rest percent-encoded), as a browser's address bar writes it: `uri` takes ASCII only.
  A typed email address with an international domain is sent with the domain in punycode too, as
  Chromium's email input sends it (not every browser does; `email` is RFC 5321's, ASCII).
  Domains are encoded by UTS 46 without transitional mappings (straße.de is not strasse.de).
- Date-times without an offset get `tz` (see timezones.py); we never assume UTC.
- A chosen option is sent as the schema spells it: a browser posts each line break in a value as
  CRLF, so a posted option is matched to the schema's with line breaks aside.
"""

from __future__ import annotations

import contextlib
import re
import unicodedata
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import idna

from approvals.safejson import text_problem

from ._common import (
    UnsupportedSchema,
    _,
    blank_is_an_answer,
    choices_of,
    kind_of,
    line_breaks,
    properties,
    required_names,
)
from .checking import check_schema
from .timezones import split_datetime, to_rfc3339
from .validation import validate

_MISSING = object()
# As many digits as Python reads into an int: the largest float, written out as a whole number the way the
# form shows an integer default, has 309.
_INTEGER = re.compile(r"[+-]?\d{1,4300}")
_DIGITS = re.compile(r"[+-]?\d+")
# Digits in groups of three, as thousands are written in many places: 1,000 1.000 1 000 1'000.
_GROUPED = re.compile(r"[+-]?\d{1,3}([,.'\u00a0\u202f ]\d{3})+")
_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,4})?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
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
        values = _values(data, prefix + name)
        if kind_of(prop) in ("single_select", "multi_select"):
            values = as_choices(choices_of(prop), values)
        if _left_as_suggested(prop, values, tz):
            content[name] = prop["default"]
            continue
        if name in required and blank_is_an_answer(prop) and values in ([], [""]):
            content[name] = ""  # the server's own value, shown as it is: blank
            continue
        value, error = _convert(kind_of(prop), values, name in required, tz)
        if value is _MISSING and not error:
            value = _taken_back(prop, posted=bool(values))
        if kind_of(prop) == "datetime" and isinstance(value, str):
            value = _within(value, prop.get("minLength", 0), prop.get("maxLength"))
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


def _left_as_suggested(prop: dict[str, Any], values: list[str], tz: str | None) -> bool:
    """A text or date-time field posted back showing the server's default as the form prefilled it."""
    default = prop.get("default")
    if not isinstance(default, str) or not default.strip() or len(values) != 1:
        return False
    kind = kind_of(prop)
    if kind == "text":
        return line_breaks(values[0]) == line_breaks(default)  # a browser sends line breaks as CRLF
    if kind == "email":
        # A browser's email input sends an international domain in ASCII (ops@bücher.example comes back as
        # ops@xn--bcher-kva.example, lower case): the address shown and left alone is the server's own.
        return _address_key(values[0]) == _address_key(default)
    if kind == "datetime":
        # Shown on the reviewer's clock (or the value's own, at the calendar's edge): that wall time may
        # happen twice on the night the clocks go back, or not be the instant in `tz` at all; as shown, it
        # means the suggested instant.
        shown, _zone = split_datetime(default, tz)
        return _wall_time(values[0]) is not None and _wall_time(values[0]) == _wall_time(shown)
    return False


def as_choices(choices: list[tuple[str, str]], values: list[str]) -> list[str]:
    """Posted options as the schema spells them. A form submission sends every line break of a value as
    CRLF, so an option holding one comes back spelled differently; other values are left as posted."""
    spelled = {value for value, _label in choices}
    by_lines: dict[str, list[str]] = {}
    for value, _label in choices:
        by_lines.setdefault(line_breaks(value), []).append(value)
    out = []
    for posted in values:
        matches = by_lines.get(line_breaks(posted), [])
        out.append(matches[0] if posted not in spelled and len(matches) == 1 else posted)
    return out


def _taken_back(prop: dict[str, Any], *, posted: bool) -> Any:
    """The answer of an optional field left empty where the server suggested a value: [] for a multi-select
    (when minItems allows it; nothing ticked posts nothing), "" for plain text posted empty (when minLength
    allows it; a text field missing from the post was not shown), else _MISSING (omitted)."""
    default, kind = prop.get("default"), kind_of(prop)
    if kind == "multi_select" and default and not prop.get("minItems"):
        return []
    if (
        kind == "text"
        and posted
        and isinstance(default, str)
        and default.strip()
        and not prop.get("minLength")
    ):
        return ""
    return _MISSING


def _wall_time(text: str) -> datetime | None:
    """A date-time without an offset, as typed or as a datetime-local input posts it; None otherwise."""
    try:
        moment = datetime.fromisoformat(text.strip().upper().replace(" ", "T"))
    except ValueError:
        return None
    return moment if moment.tzinfo is None else None


def _address_key(address: str) -> tuple[str, str]:
    """An email address as (local part, domain as a person reads it): punycode labels decoded, then case and
    width ignored in the domain only (a mailbox's own name may tell case apart)."""
    local, _at, domain = address.strip().rpartition("@")
    labels = []
    for label in re.split("[.\u3002\uff0e\uff61]", domain):
        if label[:4].lower() == "xn--":
            with contextlib.suppress(UnicodeError, ValueError):  # not punycode after all: kept as written
                label = label[4:].encode("ascii").decode("punycode")
        labels.append(unicodedata.normalize("NFKC", label).casefold())
    return local, ".".join(labels)


def _normalise_text(value: str) -> str:
    return line_breaks(value).strip()


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
        if _DIGITS.fullmatch(text):  # digits past what a number can hold
            return _MISSING, _("Enter a smaller number")
        if _GROUPED.fullmatch(text):
            return _MISSING, _("Enter the whole number without separators, like 1000")
        return _MISSING, _("Enter a whole number")
    return int(text), None


def _has_thousands(text: str) -> bool:
    """Whole digits grouped in threes (1,000 or 1 000, 12.345.678), maybe then a decimal point (1,000.5)."""
    whole, point, fraction = text.rpartition(".") if text.count(".") == 1 else (text, "", "")
    return bool(_GROUPED.fullmatch(whole)) and (not point or fraction.isdecimal())


def _number(text: str, tz: str | None) -> Converted:
    if _INTEGER.fullmatch(text):
        return int(text), None  # exact, even past 2**53
    # A strict grammar: float() alone would also take "nan", "inf" and "1_000".
    if not _DECIMAL.fullmatch(text):
        if _has_thousands(text):
            # "1,000" is a thousand to some and one to others: pointing at a decimal point invited "1.000".
            return _MISSING, _("Enter the number without thousands separators: 1000, or 1.5 for decimals")
        if "," in text:
            return _MISSING, _("Enter a number, using a point for decimals (1.5)")
        return _MISSING, _("Enter a number")
    number = float(text)
    if number in (float("inf"), float("-inf")):
        return _MISSING, _("Enter a smaller number")
    if number == 0 and any(char.isdecimal() and int(char) for char in text.lower().partition("e")[0]):
        # 1e-400 is no float: it would be sent as 0, a value nobody typed.
        return _MISSING, _("Enter a number further from zero, or 0")
    return number, None


def _url(text: str, tz: str | None) -> Converted:
    """A typed web address with letters beyond ASCII, written as the URI it stands for (as a browser's
    address bar does): the domain in punycode, the rest percent-encoded as UTF-8. The `uri` format takes
    ASCII only, and "https://bücher.example/straße" was refused as "Enter a full web address"."""
    # Text that is not valid Unicode cannot be percent-encoded: validate() says what is wrong with it.
    return (text if text.isascii() or text_problem(text) else _as_uri(text)), None


def _email(text: str, tz: str | None) -> Converted:
    """A typed address with an international domain, its domain written in ASCII as Chromium's email input
    sends it: the `email` format is RFC 5321's, and a server checking it strictly refuses ops@bücher.example.
    """
    local, at, domain = text.rpartition("@")
    if not at or domain.isascii() or text_problem(text):
        return text, None
    try:
        return f"{local}@{_ascii_host(domain)}", None
    except (idna.IDNAError, UnicodeError, ValueError):
        return text, None  # validate() says what is wrong with it


def _as_uri(text: str) -> str:
    try:
        netloc = urlsplit(text).netloc
    except ValueError:
        return text  # validate() says what is wrong with it
    userinfo, at, host_port = netloc.rpartition("@")
    host, colon, port = host_port, "", ""
    if not host_port.startswith("["):  # an IPv6 literal is ASCII, and holds colons of its own
        host, colon, port = host_port.partition(":")
    if host and not host.isascii():
        try:
            host = _ascii_host(host)
        except (idna.IDNAError, UnicodeError, ValueError):
            return text
        text = text.replace(netloc, f"{userinfo}{at}{host}{colon}{port}", 1)
    return _NON_ASCII.sub(lambda found: quote(found.group(), safe=""), text)


def _ascii_host(host: str) -> str:
    """A host name as a browser's address bar writes it: UTS 46 without the transitional mappings, as the URL
    standard has it. Python's own "idna" codec is IDNA 2003, which maps straße.de to strasse.de and drops a
    zero-width joiner: another domain than the one typed. ASCII labels are left as they are."""
    mapped = idna.uts46_remap(host, std3_rules=False, transitional=False)
    return ".".join(label if label.isascii() else idna.alabel(label).decode() for label in mapped.split("."))


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


def _within(value: str, low: int, high: int | None) -> str:
    """A converted date-time written to fit the field's length limits, as the same instant: "…+01:00" (25
    characters) past a tighter maxLength in UTC as "…Z" (20), and one short of a minLength with a fraction of
    zeros ("…10:30:00.000Z"). The reviewer picks a moment, not its spelling: otherwise the form could never
    send a valid answer, and said "Enter at least 24 characters" of a date and time picked in a calendar."""
    written = [value]
    try:
        moment = datetime.fromisoformat(value).astimezone(UTC)
    except (ValueError, OverflowError):
        pass  # validate() says what is wrong with it
    else:
        text = moment.replace(tzinfo=None).isoformat()
        written.append((text.rstrip("0").rstrip(".") if "." in text else text) + "Z")  # no trailing zeros
    written += [_with_fraction(each, low) for each in written]
    for each in written:
        if low <= len(each) and (high is None or len(each) <= high):
            return each
    return value


def _with_fraction(value: str, length: int) -> str:
    """An RFC 3339 date-time made `length` characters long, or a little more, by zeros at the end of its
    fraction of a second (a new fraction has a point and at least one digit); the instant is the same."""
    missing = length - len(value)
    seconds_end = len("2026-12-02T10:30:00")
    if missing <= 0 or len(value) < seconds_end:
        return value
    rest = value[seconds_end:]
    if not rest.startswith("."):
        return f"{value[:seconds_end]}.{'0' * max(missing - 1, 1)}{rest}"
    fraction_end = seconds_end + len(rest) - len(rest[1:].lstrip("0123456789"))  # the point and its digits
    return f"{value[:fraction_end]}{'0' * missing}{value[fraction_end:]}"


_CONVERTERS = {
    "email": _email,
    "url": _url,
    "integer": _integer,
    "number": _number,
    "date": _date,
    "datetime": _datetime,
}
