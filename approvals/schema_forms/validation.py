"""validate(): the server-side check of an answer's `content`, for the API and the browser alike.

Decisions:
- Properties the schema does not define are refused (under NON_FIELD): the reviewer form
  only sends known fields, so an unknown key means a client mistake, and forwarding it
  would hand the server data nobody was asked for.
- Values follow schema.ts (string | number | boolean | string[]); a fractional number is
  fine for `number`. As in JSON Schema, 1.0 counts as an integer; True never counts as a number.
- The hub adds: no NUL characters (PostgreSQL cannot store them), no string longer than
  MAX_VALUE_LENGTH, no option chosen twice in a multi-select, no NaN or infinity.
"""

from __future__ import annotations

from jsonschema.validators import validator_for

from ._answers import answer_problem
from ._common import NON_FIELD, _, ngettext, properties, quote, required_names
from .checking import check_schema

_NAMES_SHOWN = 5


def validate(schema: object, content: object) -> dict[str, str]:
    """Problems with `content` as an answer to `schema`, by property name; {} when it is valid.

    Problems that belong to no field (content is not an object, unknown properties, a schema
    that check_schema refuses) are under NON_FIELD ("__all__"). One message per field.
    """
    problems = check_schema(schema)
    if problems:
        return {NON_FIELD: _("This form cannot be answered: %(problem)s") % {"problem": problems[0]}}
    assert isinstance(schema, dict)
    if not isinstance(content, dict):
        return {NON_FIELD: _("The answer must be an object of field values")}
    props = properties(schema)
    errors: dict[str, str] = {}
    unknown = [str(key) for key in content if key not in props]
    if unknown:
        errors[NON_FIELD] = _unknown_message(unknown)
    required = required_names(schema)
    validator_cls = validator_for(schema)
    for name, prop in props.items():
        if name in content:
            message = answer_problem(prop, content[name], validator_cls)
        else:
            message = _("This field is required") if name in required else None
        if message:
            errors[name] = message
    return errors


def _unknown_message(names: list[str]) -> str:
    shown = ", ".join(quote(name) for name in names[:_NAMES_SHOWN])
    if len(names) > _NAMES_SHOWN:
        shown += " " + _("and %(count)s more") % {"count": len(names) - _NAMES_SHOWN}
    message = ngettext("Unexpected field: %(names)s", "Unexpected fields: %(names)s", len(names))
    return message % {"names": shown}


def is_valid(schema: object, content: object) -> bool:
    return not validate(schema, content)
