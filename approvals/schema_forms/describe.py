"""fields(): a typed, render-ready description of each property of a checked schema."""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from ._common import (
    UnsupportedSchema,
    _,
    blank_is_an_answer,
    choices_of,
    kind_of,
    ngettext,
    properties,
    required_names,
    show_limit,
    show_number,
)
from .checking import check_schema
from .timezones import split_datetime

# Single choice: radios up to about seven options (all visible at once), a select beyond.
RADIO_LIMIT = 7

_INPUT_TYPES = {
    "text": "text",
    "email": "email",
    "url": "url",
    "date": "date",
    "datetime": "datetime-local",
    # Numbers are text inputs: type=number silently drops what it cannot parse and changes
    # the value on scroll; inputmode still brings up a numeric keyboard.
    "number": "text",
    "integer": "text",
    "boolean": "checkbox",
    "multi_select": "checkbox",
}


@dataclass(frozen=True)
class Field:
    """One form field. `name` is the JSON key; `html_name` is what the form posts it as."""

    name: str
    label: str
    kind: str  # text email url date datetime number integer boolean single_select multi_select
    required: bool
    description: str = ""
    default: Any = None  # the server's default (a JSON value), None when there is none
    choices: list[tuple[str, str]] = field(default_factory=list)  # (value, label) for selects
    widget: str = "input"  # input | textarea | checkbox | radios | select | checkboxes
    html_input_type: str = "text"  # for <input type=...>; "radio", or "" for a <select> or <textarea>
    inputmode: str = ""  # "numeric" / "decimal" for numbers, else ""
    format: str = ""  # the schema's string format, if any
    min_length: int | None = None
    max_length: int | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    min_items: int | None = None
    max_items: int | None = None
    sensitive: bool = False  # looks like a credential: warn, steer towards Decline
    hint: str = ""  # the limits in words, e.g. "Whole number between 1 and 10"
    initial: str | bool | list[str] = ""  # prefill in the form's own terms (default or empty)
    initial_tz: str = ""  # datetime only: the zone or offset `initial` is written in
    html_name: str = ""
    html_id: str = ""


def fields(schema: object, *, tz: str | None = None, prefix: str = "") -> list[Field]:
    """Describe each property in schema order. Raises UnsupportedSchema if check_schema refuses.

    `tz` (an IANA zone or an offset) is the reviewer's time zone: date-time defaults are
    shown in it; without it they keep the server's own offset, given in `initial_tz`.
    `prefix` is prepended to html_name, so no property can collide with the page's own
    inputs (csrfmiddlewaretoken, the action buttons); pass the same prefix to coerce().
    """
    props, required = _checked(schema)
    described = [
        _describe(name, prop, name in required and not blank_is_an_answer(prop), index, tz, prefix)
        for index, (name, prop) in enumerate(props.items())
    ]
    # Fields a reviewer cannot tell apart by their labels ("Dry run" twice) name their keys too.
    labels = told_apart([each.label for each in described], [each.name for each in described])
    return [replace(each, label=label) for each, label in zip(described, labels, strict=True)]


def is_confirmation(schema: object) -> bool:
    """True when the schema asks for nothing: the action buttons are the whole answer.

    A schema with one boolean is deliberately *not* a confirmation: "Also delete backups?"
    must stay a checkbox, or approving the request would silently answer yes to it.
    """
    props, _required = _checked(schema)
    return not props


def sensitive_fields(schema: object) -> list[str]:
    """Names of the properties that look like they ask for a credential.

    Unlike the other functions this never raises: it also serves redaction (audit logs), where
    a best effort over whatever properties exist is safer than an exception.
    """
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    return [
        name
        for name, prop in props.items()
        if isinstance(name, str) and looks_sensitive(name, prop if isinstance(prop, dict) else {})
    ]


def _checked(schema: object) -> tuple[dict[str, dict[str, Any]], set[str]]:
    problems = check_schema(schema)
    if problems:
        raise UnsupportedSchema(problems)
    assert isinstance(schema, dict)
    return properties(schema), required_names(schema)


def _describe(
    name: str, prop: dict[str, Any], required: bool, index: int, tz: str | None, prefix: str
) -> Field:
    kind = kind_of(prop)
    choices = _distinct_labels(choices_of(prop))
    initial, initial_tz = _initial(kind, prop.get("default"), tz)
    numeric = kind in ("number", "integer")
    # An <input> drops every line break of its value (HTML's value sanitization): text that has some is
    # shown, and sent back, in a <textarea>.
    multi_line = kind == "text" and isinstance(initial, str) and _has_line_break(initial)
    return Field(
        name=name,
        label=label_for(name, prop),
        kind=kind,
        required=required,
        description=prop.get("description", ""),
        default=prop.get("default"),
        choices=choices,
        widget="textarea" if multi_line else _widget(kind, len(choices)),
        html_input_type="" if multi_line else _html_input_type(kind, len(choices)),
        inputmode=_inputmode(kind, prop.get("minimum")) if numeric else "",
        format=prop.get("format", ""),
        # A date-time's length limits are the hub's to meet (coercion writes the picked instant to fit them):
        # measured against the picker's "2026-12-02T10:30", a minLength of 21 refused every date and time.
        min_length=None if kind == "datetime" else prop.get("minLength"),
        max_length=None if kind == "datetime" else prop.get("maxLength"),
        minimum=prop.get("minimum"),
        maximum=prop.get("maximum"),
        min_items=prop.get("minItems"),
        max_items=prop.get("maxItems"),
        sensitive=looks_sensitive(name, prop),
        hint=_hint(kind, prop),
        initial=initial,
        initial_tz=initial_tz,
        html_name=prefix + name,
        html_id=f"field-{index}",  # names can hold any character; ids must be safe in URLs and CSS
    )


def _has_line_break(text: str) -> bool:
    return "\n" in text or "\r" in text


def _distinct_labels(choices: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Choices a reviewer can tell apart: a blank label shows its value, and labels that read alike (case,
    spacing and invisible characters aside) show their values too ("Keep (keep)", "Keep (delete_all)"), as
    `told_apart` tells them apart."""
    values = [value for value, _label in choices]
    read = [reading(label) for _value, label in choices]
    labels = [label if read[index] else value for index, (value, label) in enumerate(choices)]
    readings = [each or reading(value) for each, value in zip(read, values, strict=True)]
    return list(zip(values, told_apart(labels, values, keyed=True, readings=readings), strict=True))


def told_apart(
    labels: list[str], keys: list[str], *, keyed: bool = False, readings: list[str] | None = None
) -> list[str]:
    """`labels` a reviewer can tell apart: those that read alike show their keys ("Keep (keep)"; with
    `keyed`, not a label that is its key already). A server may write a title that reads as another label
    once that one shows its key (titles "Keep (keep)", "Keep" and "Keep" for keys a, keep and archive): those
    that still read alike show their keys once more, and if any still do, every label is numbered by its
    place ("1. ", "2. "), which no title can take. `readings` are the labels' `reading`s, when the caller
    has them already (each is read once: a large form's titles are thousands of characters each)."""
    labels = list(labels)
    readings = [reading(label) for label in labels] if readings is None else list(readings)
    for again in (False, True):
        counts = Counter(readings)
        if max(counts.values(), default=0) < 2:
            return labels
        for index, key in enumerate(keys):
            label = labels[index]
            if counts[readings[index]] > 1 and (again or not keyed or label != key):
                labels[index] = f"{label.strip()} ({key})"
                readings[index] = reading(labels[index])
    if max(Counter(readings).values(), default=0) > 1:
        labels = [f"{index}. {label}" for index, label in enumerate(labels, start=1)]
    return labels


def reading(text: str) -> str:
    """A label as a reader takes it in: case, runs of spaces and invisible (format) characters ignored."""
    shown = unicodedata.normalize("NFKC", text)
    if not shown.isascii():  # ASCII has no format characters
        shown = _format_characters().sub("", shown)
    return " ".join(shown.casefold().split())


@functools.cache
def _format_characters() -> re.Pattern[str]:
    """Every format (Cf) character, as one pattern: looking up each character's category in Python took
    seconds over the titles of a large form, on every page that drew it. Built once per process."""
    ranges: list[list[int]] = []
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)) != "Cf":
            continue
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return re.compile(
        "[" + "".join(f"{re.escape(chr(low))}-{re.escape(chr(high))}" for low, high in ranges) + "]+"
    )


def _widget(kind: str, choice_count: int) -> str:
    if kind == "single_select":
        return "radios" if choice_count <= RADIO_LIMIT else "select"
    return {"boolean": "checkbox", "multi_select": "checkboxes"}.get(kind, "input")


def _html_input_type(kind: str, choice_count: int) -> str:
    if kind == "single_select":
        return "radio" if choice_count <= RADIO_LIMIT else ""
    return _INPUT_TYPES[kind]


def _inputmode(kind: str, minimum: int | float | None) -> str:
    # Phone keyboards for inputmode numeric/decimal often lack a minus key, so a field that
    # accepts negative numbers keeps the full keyboard.
    if minimum is None or minimum < 0:
        return ""
    return "numeric" if kind == "integer" else "decimal"


def _initial(kind: str, default: Any, tz: str | None) -> tuple[str | bool | list[str], str]:
    if kind == "boolean":
        return bool(default), ""
    if kind == "multi_select":
        return list(default or []), ""
    if kind == "datetime":
        return split_datetime(default, tz) if default is not None else ("", tz or "")
    if default is None:
        return "", ""
    if kind == "integer":
        return str(int(default)), ""  # 1e20 is a valid integer default, but "1e+20" is not a whole number
    if kind == "number":
        return show_number(default), ""
    return default, ""


# -- labels


_ACRONYMS = {"id", "url", "uri", "api", "ip", "dns", "ssh", "http", "https", "json", "sql", "utc", "sku"}


def _words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)  # startDate -> start Date
    # APIKey -> API Key. One capital and a lookahead, not "([A-Z]+)([A-Z][a-z])": that form backtracks
    # over a whole run of capitals at every position, quadratic in titles and keys servers choose.
    spaced = re.sub(r"([A-Z])(?=[A-Z][a-z])", r"\1 ", spaced)
    return re.split(r"[\W_]+", spaced)


def humanize(key: str) -> str:
    """A readable label from a JSON key: "start_date" -> "Start date", "userId" -> "User ID"."""
    words = [word for word in _words(key) if word]
    if not words:
        return key
    shouting = key.isupper()  # API_KEY: the capitals say nothing about which words are acronyms
    out = []
    for word in words:
        if word.lower() in _ACRONYMS:
            out.append(word.upper())
        elif word.isupper() and len(word) > 1 and not shouting:
            out.append(word)  # an acronym we do not know, like "SLA"
        else:
            out.append(word.lower())
    out[0] = out[0][:1].upper() + out[0][1:]
    return " ".join(out)


def label_for(name: str, prop: dict[str, Any]) -> str:
    title = prop.get("title", "")
    return title.strip() if title.strip() else humanize(name)


# -- credentials: servers MUST NOT ask for them in form mode, so we warn when one seems to


_SENSITIVE_PATTERNS = [
    r"\bpass ?(word|wd|phrase|code)s?\b",
    r"\bpwd\b",
    r"\bsecrets?\b",
    r"\bcredentials?\b",
    r"\b(api|access|private|secret|signing|encryption|ssh|gpg|pgp|license|licence) ?keys?\b",
    r"\btoken\b",  # singular only: "max_tokens" is an LLM setting, not a credential
    r"\b(access|refresh|auth|bearer|api|session|id) tokens\b",
    r"\b(bearer|jwt|otp|totp|2fa|mfa)\b",
    r"\b(auth|authorization|verification|security|recovery|backup) codes?\b",
    r"\b(credit|debit|payment|bank) ?cards?\b",
    r"\b(card|cc) ?(number|num|no)\b",
    r"\bcv[cv]2?\b",
    r"\bpin\b",
    r"\b(iban|ssn)\b",
    r"\b(routing number|bank account|sort code|social security)\b",
    r"\b(seed|recovery|mnemonic) ?(phrase|words?)\b",
]
_SENSITIVE = re.compile("|".join(_SENSITIVE_PATTERNS))
# Words that name a credential only in a key ("smtp_pass", "Authorization"), "pass" only as its last word
# ("pass_rate" is not one); in a title or description they are ordinary words ("Did the check pass?").
_SENSITIVE_KEY = re.compile(r"\b(pass|passw|pw)( \d+)?$|\bauthorization\b")
# "Password" in a few other languages, Persian and German first as the hub ships them
# (matched as plain substrings: CJK has no word boundaries).
_SENSITIVE_WORDS: tuple[str, ...] = (
    "رمز عبور",
    "گذرواژه",
    "کلمه عبور",
    "passwort",
    "kennwort",
    "mot de passe",
    "contraseña",
    "senha",
    "пароль",
    "密码",
    "密碼",
    "パスワード",
    "비밀번호",
    "كلمة المرور",
    "סיסמה",
)


def _normalise(text: str) -> str:
    # A letter followed by a digit starts a new word, so "password2" (the usual "type it again" field)
    # and "apiKey1" read as the words they are; "2fa" keeps its digit first.
    return re.sub(r"(?<=[^\W\d_])(?=\d)", " ", " ".join(word.lower() for word in _words(text) if word))


def looks_sensitive(name: str, prop: dict[str, Any]) -> bool:
    """Whether the key, title or description suggests a password, key, token or card detail.

    Name, email and username are allowed by the spec and are not flagged. Matching the
    description can warn needlessly ("not your password"); a spare warning is cheap.
    """
    # Matched as read (NFKC): "password" in fullwidth, mathematical bold or circled letters shows as the plain
    # word, and passed for no credential at all (no warning, and the answer audited unredacted).
    if _SENSITIVE_KEY.search(_normalise(unicodedata.normalize("NFKC", name))):
        return True
    for text in (name, prop.get("title"), prop.get("description")):
        if not isinstance(text, str):
            continue
        text = unicodedata.normalize("NFKC", text)
        if _SENSITIVE.search(_normalise(text)):
            return True
        if any(word in text.lower() for word in _SENSITIVE_WORDS):
            return True
    return False


# -- hints: the limits in words


def _range(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        if low == high:
            return _("Exactly %(low)s") % {"low": low}
        return _("Between %(low)s and %(high)s") % {"low": low, "high": high}
    if low is not None:
        return _("At least %(low)s") % {"low": low}
    return _("At most %(high)s") % {"high": high} if high is not None else ""


def _hint(kind: str, prop: dict[str, Any]) -> str:
    if kind in ("number", "integer"):
        low, high = prop.get("minimum"), prop.get("maximum")
        whole = kind == "integer"
        limits = _range(
            show_limit(low, whole=whole, lowest=True) if low is not None else None,
            show_limit(high, whole=whole, lowest=False) if high is not None else None,
        )
        if kind == "number":
            return limits
        return _("Whole number, %(limits)s") % {"limits": limits.lower()} if limits else _("Whole number")
    if kind == "multi_select":
        return _count_hint(prop.get("minItems"), prop.get("maxItems"), "choice")
    parts = (
        [] if kind == "datetime" else [_count_hint(prop.get("minLength"), prop.get("maxLength"), "character")]
    )
    parts.append(
        {
            "date": _("For example 2026-12-02"),
            "datetime": _("Date and time, for example 2026-12-02 10:30"),
            "url": _("A full address, for example https://example.com"),
        }.get(kind, "")
    )
    return "; ".join(part for part in parts if part)


def _count_hint(low: int | None, high: int | None, unit: str) -> str:
    """ "Between 1 and 3 choices", "At most 40 characters", "At least 1 choice"."""
    if low == 0:
        low = None  # "at least 0" says nothing
    if low is None and high is None:
        return ""
    count = high if high is not None else low
    assert count is not None
    if unit == "choice":
        noun = ngettext("choice", "choices", count)
    else:
        noun = ngettext("character", "characters", count)
    return f"{_range(low, high)} {noun}"
