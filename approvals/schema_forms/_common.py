"""Shared pieces: translation that works without settings, limits, and schema accessors.

Everything here is pure: no models, no database, and no Django settings needed. Messages go
through Django's translation only when Django is fully set up, so the functions also work
in plain unit tests and scripts.
"""

from __future__ import annotations

import math
from typing import Any

from django.apps import apps
from django.conf import settings
from django.utils import translation

# Key used for problems that belong to no single field (like Django's NON_FIELD_ERRORS).
NON_FIELD = "__all__"

# Limits against hostile or absurd schemas. Real elicitation forms are a handful of fields.
MAX_PROPERTIES = 100
MAX_CHOICES = 500  # a country (249) or time zone (about 420) picker fits
MAX_NAME_LENGTH = 100
MAX_SCHEMA_STRING = 10_000  # any single string in a schema (descriptions included)
MAX_SCHEMA_NODES = 100_000  # 100 fields x 200 titled choices fits comfortably; 100 x 500 does not
MAX_SCHEMA_DEPTH = 10  # the deepest legal path (items -> anyOf -> const) is 7 levels
MAX_MIN_LENGTH = 10_000  # a larger minLength would make us invent huge placeholder answers
# The hub's own cap on one answer string, even when the server set no maxLength.
MAX_VALUE_LENGTH = 100_000

STRING_FORMATS = ("email", "uri", "date", "date-time")
_KIND_BY_FORMAT = {"email": "email", "uri": "url", "date": "date", "date-time": "datetime"}

# Annotations that never change what a valid answer is, accepted anywhere and ignored.
ANNOTATIONS = frozenset({"title", "description", "$comment", "examples"})


class UnsupportedSchema(ValueError):
    """Raised when a function that renders or fills a form gets a schema check_schema refuses."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _translation_ready() -> bool:
    # gettext needs configured settings and a loaded app registry; without them we stay in
    # English instead of raising, so the pure functions run anywhere.
    return settings.configured and apps.ready


def _(message: str) -> str:
    """gettext when Django is ready, the English text otherwise (named `_` so makemessages finds it)."""
    return translation.gettext(message) if _translation_ready() else message


def ngettext(singular: str, plural: str, count: int) -> str:
    """Plural-aware twin of `_` (same name as Django's so makemessages extracts both forms)."""
    if _translation_ready():
        return translation.ngettext(singular, plural, count)
    return singular if count == 1 else plural


def quote(name: str) -> str:
    """A property name as shown inside messages: quoted and cut short (names come from servers)."""
    shown = name if len(name) <= 60 else name[:57] + "..."
    return f"\u201c{shown}\u201d"


def is_number(value: object) -> bool:
    """A JSON number: int or finite float, and never a bool (True is an int in Python)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def show_number(value: int | float) -> str:
    """A number the way a person writes it: 10 rather than 10.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def line_breaks(text: str) -> str:
    """Text with every line break as LF: what a form submission leaves of it (it sends each as CRLF)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def show_limit(value: int | float, *, whole: bool, lowest: bool) -> str:
    """A minimum or maximum as the field takes it: for a whole number field, the first whole number inside it,
    written out (a minimum of 1e20 is "100000000000000000000", which the field accepts, not "1e+20")."""
    if whole:
        return str(math.ceil(value) if lowest else math.floor(value))
    return show_number(value)


def properties(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The properties of an already checked schema (a missing `properties` means none)."""
    return schema.get("properties") or {}


def required_names(schema: dict[str, Any]) -> set[str]:
    return set(schema.get("required") or [])


def blank_is_an_answer(prop: dict[str, Any]) -> bool:
    """A plain text field whose server suggests "" (and allows it: no minLength): left blank, it answers "",
    required or not. The server wrote that value itself; a required field the reviewer could not leave as
    the server filled it would have to be made up."""
    return kind_of(prop) == "text" and prop.get("default") == "" and not prop.get("minLength")


def kind_of(prop: dict[str, Any]) -> str:
    """The field kind of a checked property (see Field.kind)."""
    prop_type = prop.get("type")
    if prop_type == "string":
        if "enum" in prop or "oneOf" in prop:
            return "single_select"
        return _KIND_BY_FORMAT.get(prop.get("format", ""), "text")
    if prop_type == "array":
        return "multi_select"
    return str(prop_type)  # number, integer, boolean


def choices_of(prop: dict[str, Any]) -> list[tuple[str, str]]:
    """(value, label) pairs of a checked select property, in schema order; [] for other kinds."""
    source = prop.get("items", {}) if prop.get("type") == "array" else prop
    if "enum" in source:
        labels = source.get("enumNames") or source["enum"]  # enumNames: legacy display labels
        return list(zip(source["enum"], labels, strict=True))
    options = source.get("oneOf") or source.get("anyOf") or []
    # A titled option without a title is shown by its value rather than refused.
    return [(option["const"], option.get("title") or option["const"]) for option in options]
