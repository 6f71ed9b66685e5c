"""Checking one answer value against one property, with short human messages.

Shared by validate() (answers) and check_schema() (a server's own defaults must be valid too).
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from jsonschema import FormatChecker
from jsonschema.exceptions import ValidationError as SchemaValidationError

from approvals.safejson import text_problem

from ._common import MAX_VALUE_LENGTH, _, choices_of, kind_of, ngettext, show_limit

# With the format-nongpl extra installed this checks uri and date-time too (without it they
# would pass silently). jsonschema's own email check only looks for an "@", which lets "a@"
# through and the server would refuse it later, so email uses Django's stricter validator.
FORMAT_CHECKER = FormatChecker()


@FORMAT_CHECKER.checks("email", raises=ValidationError)
def _is_email(instance: object) -> bool:
    if isinstance(instance, str):
        validate_email(instance)
    return True


def _whole_text_only(format_name: str) -> None:
    """The date-time and uri checks match their patterns with `$`, which in Python also matches before a final
    line break: "2026-12-02T10:30:00Z\n" passed and was sent on, to a server whose own check refuses it."""
    check, raises = FORMAT_CHECKER.checkers[format_name]

    def whole(instance: object) -> bool:
        if isinstance(instance, str) and instance.endswith("\n"):
            return False
        return bool(check(instance))

    FORMAT_CHECKER.checks(format_name, raises=raises)(whole)


for _format_name in ("date-time", "uri"):
    _whole_text_only(_format_name)


def _type_messages() -> dict[str, str]:
    return {
        "text": _("Enter text"),
        "email": _("Enter an email address"),
        "url": _("Enter a web address"),
        "date": _("Enter a date"),
        "datetime": _("Enter a date and time"),
        "number": _("Enter a number"),
        "integer": _("Enter a whole number"),
        "boolean": _("Must be true or false"),
        "single_select": _("Choose one of the options"),
        "multi_select": _("Must be a list of options"),
    }


def _format_messages() -> dict[str, str]:
    return {
        "email": _("Enter an email address like name@example.com"),
        "uri": _("Enter a full web address like https://example.com"),
        "date": _("Enter a real date as YYYY-MM-DD"),
        "date-time": _("Enter a date and time with a time zone, like 2026-12-02T10:30:00+01:00"),
    }


# When a value breaks several rules, say the most basic thing first (wrong type before range).
_PRIORITY = {"type": 0, "enum": 1, "oneOf": 1, "anyOf": 1, "const": 1, "format": 2}


def _hub_rule_problem(kind: str, value: object) -> str | None:
    """Rules the hub adds on top of the schema."""
    if isinstance(value, str):
        if "\x00" in value:
            # PostgreSQL cannot store NUL in text or jsonb, and no person types one.
            return _("Remove the null character")
        if text_problem(value):
            return _("Remove the characters that are not valid text")
        if len(value) > MAX_VALUE_LENGTH:
            return _length_message("maxLength", MAX_VALUE_LENGTH)
    if isinstance(value, float) and not math.isfinite(value):
        return _type_messages()[kind]
    # A multi-select is a set of ticked boxes: a repeated option is a sender's mistake.
    if isinstance(value, list) and _has_repeats(value):
        return _("Choose each option only once")
    return None


def _has_repeats(items: list[Any]) -> bool:
    texts = [item for item in items if isinstance(item, str)]  # other items fail the type check
    return len(set(texts)) < len(texts)


def _length_message(keyword: str, count: int) -> str:
    if keyword == "minLength":
        text = ngettext("Enter at least %(count)s character", "Enter at least %(count)s characters", count)
    else:
        text = ngettext("Enter at most %(count)s character", "Enter at most %(count)s characters", count)
    return text % {"count": count}


def _items_message(keyword: str, count: int) -> str:
    if keyword == "minItems":
        text = ngettext("Choose at least %(count)s option", "Choose at least %(count)s options", count)
    else:
        text = ngettext("Choose at most %(count)s option", "Choose at most %(count)s options", count)
    return text % {"count": count}


def _message(error: SchemaValidationError, kind: str) -> str:
    keyword = error.validator
    inside_list = bool(error.absolute_path)  # the error is about one item of a multi-select
    if keyword == "type":
        return _("Choose only from the options") if inside_list else _type_messages()[kind]
    if keyword in ("enum", "oneOf", "anyOf", "const"):
        return _("Choose only from the options") if kind == "multi_select" else _("Choose one of the options")
    if keyword == "format":
        return _format_messages().get(str(error.validator_value), _("Enter a valid value"))
    if keyword in ("minLength", "maxLength"):
        return _length_message(keyword, int(error.validator_value))
    if keyword in ("minItems", "maxItems"):
        return _items_message(keyword, int(error.validator_value))
    if keyword == "minimum":
        limit = show_limit(error.validator_value, whole=kind == "integer", lowest=True)
        return _("Must be at least %(limit)s") % {"limit": limit}
    if keyword == "maximum":
        limit = show_limit(error.validator_value, whole=kind == "integer", lowest=False)
        return _("Must be at most %(limit)s") % {"limit": limit}
    return _("Enter a valid value")


def answer_problem(prop: dict[str, Any], value: object, validator_cls: Any) -> str | None:
    """The first problem with `value` as an answer to the checked property `prop`, or None."""
    kind = kind_of(prop)
    problem = _hub_rule_problem(kind, value)
    if problem:
        return problem
    if kind == "multi_select" and isinstance(value, list):
        # The options are checked here, one set lookup each: jsonschema tries every titled option on every
        # item and reports every item that fails, so a list of thousands (a server's default, a client's
        # answer) took minutes. Past this point at most one item per option is left, each one of them.
        offered = {choice for choice, _label in choices_of(prop)}
        if not all(isinstance(item, str) and item in offered for item in value):
            return _("Choose only from the options")
        prop = {key: rule for key, rule in prop.items() if key != "items"}
    validator = validator_cls(prop, format_checker=FORMAT_CHECKER)
    errors = list(validator.iter_errors(value))
    if not errors:
        return None
    best = min(errors, key=lambda error: _PRIORITY.get(str(error.validator), 9))
    return _message(best, kind)
