"""check_schema(): is a server's requestedSchema inside the restricted subset we can render?

Policy: refuse anything that could change what a valid answer is and that we do not enforce
(pattern, $ref, composition, unknown keywords, unknown formats), because a form that silently
drops a constraint lets reviewers send answers the server will reject, or worse, trust.
Pure annotations (title, description, $comment, examples) are accepted and ignored, and so are
a top-level `additionalProperties: false` and a multi-select's `uniqueItems`, which only say what
validate() enforces anyway. A null `default` is no default.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from approvals.safejson import text_problem

from ._answers import answer_problem
from ._common import (
    ANNOTATIONS,
    MAX_CHOICES,
    MAX_MIN_LENGTH,
    MAX_NAME_LENGTH,
    MAX_PROPERTIES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NODES,
    MAX_SCHEMA_STRING,
    NON_FIELD,
    STRING_FORMATS,
    _,
    is_number,
    line_breaks,
    quote,
)

_TOP_KEYS = ANNOTATIONS | {"$schema", "type", "properties", "required", "additionalProperties"}
_KEYS = {
    "string": ANNOTATIONS | {"type", "default", "minLength", "maxLength", "format"},
    "enum": ANNOTATIONS | {"type", "default", "enum", "enumNames"},
    "oneOf": ANNOTATIONS | {"type", "default", "oneOf"},
    "number": ANNOTATIONS | {"type", "default", "minimum", "maximum"},
    "boolean": ANNOTATIONS | {"type", "default"},
    # uniqueItems says what the hub enforces anyway (no option twice); pydantic writes it for a set.
    "array": ANNOTATIONS | {"type", "default", "items", "minItems", "maxItems", "uniqueItems"},
    "items_enum": ANNOTATIONS | {"type", "enum"},
    "items_anyOf": ANNOTATIONS | {"type", "anyOf"},
    "option": {"const", "title"},
}
# Worth naming when a property has no type: it is probably built out of these.
_COMPOSITION = {"$ref", "$defs", "definitions", "allOf", "anyOf", "oneOf", "not", "if", "then", "else"}
_MAX_PROBLEMS = 20


def check_schema(schema: object) -> list[str]:
    """Problems that stop `schema` being shown as a form; an empty list means it is supported."""
    if not isinstance(schema, dict):
        return [_("The form description must be a JSON object")]
    size_problem = _size_problem(schema)
    if size_problem:
        return [size_problem]
    problems = _top_level_problems(schema)
    props = schema.get("properties")
    if isinstance(props, dict) and len(props) <= MAX_PROPERTIES:
        for name, prop in props.items():
            problems += _property_problems(name, prop)
    # The full JSON Schema checks only run on schemas already inside the subset: they would
    # repeat problems found above in a less readable way.
    if not problems:
        problems = _metaschema_problems(schema)
    if not problems:
        problems = _dialect_problems(schema)
    if not problems:
        problems = _default_problems(schema)
    if len(problems) > _MAX_PROBLEMS:
        rest = len(problems) - _MAX_PROBLEMS
        problems = [*problems[:_MAX_PROBLEMS], _("...and %(count)s more problems") % {"count": rest}]
    return problems


def _field(name: str, problem: str) -> str:
    return _("Field %(name)s: %(problem)s") % {"name": quote(name), "problem": problem}


# -- size and JSON-ness, walked without recursion so hostile nesting cannot overflow the stack


def _size_problem(schema: dict[str, Any]) -> str | None:
    stack: list[tuple[object, int]] = [(schema, 1)]
    nodes = 1
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return _("The form description is nested too deeply")
        children: list[object] = []
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    return _("The form description is not valid JSON (a key is not text)")
                problem = _text_problem(key)
                if problem:
                    return problem
                children.append(value)
        elif isinstance(node, list):
            children = node
        elif isinstance(node, str):
            problem = _text_problem(node)
            if problem:
                return problem
        elif isinstance(node, float) and not math.isfinite(node):
            return _("The form description contains a number that is not finite")
        elif node is not None and not isinstance(node, bool | int | float):
            return _("The form description is not valid JSON")
        nodes += len(children)  # counted before walking, so a huge list is refused at once
        if nodes > MAX_SCHEMA_NODES:
            return _("The form description is too large")
        stack.extend((child, depth + 1) for child in children)
    return None


def _text_problem(text: str) -> str | None:
    if len(text) > MAX_SCHEMA_STRING:
        return _("The form description contains text longer than %(count)s characters") % {
            "count": MAX_SCHEMA_STRING
        }
    if "\x00" in text:
        return _("The form description contains a null character")
    if text_problem(text):
        # A lone surrogate: no answer holding it can be stored or sent, and no page can show it.
        return _("The form description contains characters that are not valid text")
    return None


# -- the top level


def _top_level_problems(schema: dict[str, Any]) -> list[str]:
    problems = [_unsupported(None, key) for key in schema if key not in _TOP_KEYS]
    problems += _annotation_problems(None, schema)
    if schema.get("type") != "object":
        problems.append(_('The form description must have "type": "object".'))
    if "$schema" in schema:
        declared = schema["$schema"]
        if not isinstance(declared, str) or validator_for(schema, default=None) is None:
            problems.append(_("The form description declares an unknown JSON Schema version"))
    if schema.get("additionalProperties", False) is not False:
        problems.append(_("Only additionalProperties: false is supported"))
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        problems.append(_('"properties" must be an object of fields.'))
        props = {}
    elif len(props) > MAX_PROPERTIES:
        problems.append(_("The form has more than %(count)s fields") % {"count": MAX_PROPERTIES})
    problems += _required_problems(schema.get("required", []), props)
    return problems


def _required_problems(required: object, props: dict[str, Any]) -> list[str]:
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        return [_('"required" must be a list of field names.')]
    if len(set(required)) != len(required):
        return [_('"required" lists a field twice.')]
    return [
        _('"required" names %(name)s, which is not a field.') % {"name": quote(name)}
        for name in required
        if name not in props
    ]


def _annotation_problems(name: str | None, node: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("title", "description", "$comment"):
        if key in node and not isinstance(node[key], str):
            problems.append(_located(name, _("%(keyword)s must be text") % {"keyword": quote(key)}))
    if "examples" in node and not isinstance(node["examples"], list):
        problems.append(_located(name, _('"examples" must be a list.')))
    return problems


def _located(name: str | None, problem: str) -> str:
    return problem if name is None else _field(name, problem)


def _unsupported(name: str | None, keyword: str) -> str:
    return _located(name, _("%(keyword)s is not supported in forms") % {"keyword": quote(keyword)})


# -- one property


def _property_problems(name: str, prop: object) -> list[str]:
    problems = _name_problems(name)
    if not isinstance(prop, dict):
        return [*problems, _field(name, _("must be described by a JSON object"))]
    variant = _variant(prop)
    if variant is None:
        composed = [_unsupported(name, key) for key in prop if key in _COMPOSITION]
        return [*problems, _field(name, _type_problem(prop)), *composed]
    problems += [_unsupported(name, key) for key in prop if key not in _KEYS[variant]]
    problems += _annotation_problems(name, prop)
    problems += [_field(name, problem) for problem in _VARIANT_CHECKS[variant](prop)]
    return problems


def _name_problems(name: str) -> list[str]:
    if not name.strip():
        return [_("A field has an empty name")]
    if len(name) > MAX_NAME_LENGTH:
        return [_field(name, _("the name is longer than %(count)s characters") % {"count": MAX_NAME_LENGTH})]
    if not name.isprintable():
        return [_field(name, _("the name contains control characters"))]
    if name == NON_FIELD:
        # Reserved: validate() reports problems that belong to no field under this key.
        return [_field(name, _("this name is reserved"))]
    return []


def _variant(prop: dict[str, Any]) -> str | None:
    """Which allowed shape a property claims to be, judged by its type and select keyword."""
    prop_type = prop.get("type")
    if prop_type == "string":
        if "enum" in prop:
            return "enum"
        return "oneOf" if "oneOf" in prop else "string"
    if prop_type in ("number", "integer"):
        return "number"
    if prop_type in ("boolean", "array"):
        return str(prop_type)
    return None


def _type_problem(prop: dict[str, Any]) -> str:
    prop_type = prop.get("type")
    if "type" not in prop:
        return _("has no type")
    if prop_type == "object" or "properties" in prop:
        return _("nested objects are not supported")
    if isinstance(prop_type, list):
        return _("must have exactly one type")
    return _("this type is not supported")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _string_problems(prop: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("minLength", "maxLength"):
        if key in prop and not _is_count(prop[key]):
            problems.append(_("%(keyword)s must be a whole number, 0 or more") % {"keyword": quote(key)})
    if problems:
        return problems
    if prop.get("minLength", 0) > MAX_MIN_LENGTH:
        problems.append(_('"minLength" is larger than %(count)s.') % {"count": MAX_MIN_LENGTH})
    if prop.get("minLength", 0) > prop.get("maxLength", math.inf):
        problems.append(_('"minLength" is larger than "maxLength".'))
    if "format" in prop and prop["format"] not in STRING_FORMATS:
        problems.append(_("only the formats email, uri, date and date-time are supported"))
    elif "format" in prop and not problems:
        problems += _format_length_problems(prop["format"], prop.get("minLength", 0), prop.get("maxLength"))
    return problems


def _format_length_problems(format_name: str, low: int, high: int | None) -> list[str]:
    """Length limits no value of the format can meet: a form nobody can fill in (it is refused whatever
    is typed, and "accept with defaults" had only invalid answers to send)."""
    top = math.inf if high is None else high
    fits = {
        "date": low <= 10 <= top,  # YYYY-MM-DD
        "date-time": low <= 20 <= top or top >= max(low, 22),  # ...T10:30:00Z, then a fraction ".0" or more
        "email": low <= 320 and top >= max(low, 6),  # a@b.co; longer addresses are not valid
        "uri": top >= max(low, 2),  # a:
    }
    if fits[format_name]:
        return []
    message = {
        "date": _('"minLength" and "maxLength" leave no valid date (a date has 10 characters).'),
        "date-time": _(
            '"minLength" and "maxLength" leave no valid date and time (one has at least 20 characters).'
        ),
        "email": _('"minLength" and "maxLength" leave no valid email address (one has 6 to 320 characters).'),
        "uri": _('"maxLength" leaves no valid web address (one has at least 2 characters).'),
    }
    return [message[format_name]]


def _choice_list_problems(values: object, keyword: str) -> list[str]:
    where = {"keyword": quote(keyword)}
    if not isinstance(values, list) or not values:
        return [_("%(keyword)s must be a non-empty list") % where]
    if len(values) > MAX_CHOICES:
        return [_("%(keyword)s has more than %(count)s choices") % {**where, "count": MAX_CHOICES}]
    if not all(isinstance(value, str) for value in values):
        return [_("%(keyword)s must contain only text") % where]
    if "" in values:
        # An empty choice cannot be told apart from "nothing chosen" in an HTML form.
        return [_("%(keyword)s contains an empty choice") % where]
    if len(set(values)) != len(values):
        return [_("%(keyword)s lists a choice twice") % where]
    if len({line_breaks(value) for value in values}) != len(values):
        # A browser posts every line break of a value as CRLF: whichever of the two the reviewer chose, the
        # answer would be the one spelled with CRLF.
        return [_("%(keyword)s lists two choices that differ only in their line breaks") % where]
    return []


def _enum_problems(prop: dict[str, Any]) -> list[str]:
    problems = _choice_list_problems(prop["enum"], "enum")
    names = prop.get("enumNames")
    if "enumNames" in prop and not problems:
        if not isinstance(names, list) or not all(isinstance(label, str) for label in names):
            problems.append(_('"enumNames" must be a list of text.'))
        elif len(names) != len(prop["enum"]):
            problems.append(_('"enumNames" must have one label per "enum" value.'))
    return problems


def _option_problems(options: object, keyword: str) -> list[str]:
    """Titled choices: [{"const": value, "title": label}, ...]."""
    if not isinstance(options, list) or not all(isinstance(option, dict) for option in options):
        return [_("%(keyword)s must be a list of {const, title} objects") % {"keyword": quote(keyword)}]
    for option in options:
        extra = sorted(set(option) - _KEYS["option"])
        if extra:
            return [_unsupported(None, f"{keyword}[].{extra[0]}")]
        if "title" in option and not isinstance(option["title"], str):
            return [_("each choice's title must be text")]
    return _choice_list_problems([option.get("const") for option in options], f"{keyword}[].const")


def _one_of_problems(prop: dict[str, Any]) -> list[str]:
    return _option_problems(prop["oneOf"], "oneOf")


def _number_problems(prop: dict[str, Any]) -> list[str]:
    problems = [
        _("%(keyword)s must be a number") % {"keyword": quote(key)}
        for key in ("minimum", "maximum")
        if key in prop and not is_number(prop[key])
    ]
    if problems or "minimum" not in prop or "maximum" not in prop:
        return problems
    low, high = prop["minimum"], prop["maximum"]
    if low > high:
        return [_('"minimum" is larger than "maximum".')]
    if prop["type"] == "integer" and math.ceil(low) > math.floor(high):
        return [_("no whole number lies between the minimum and the maximum")]
    return []


def _boolean_problems(prop: dict[str, Any]) -> list[str]:
    return []  # a boolean only has annotations and a default (checked with all defaults)


def _array_problems(prop: dict[str, Any]) -> list[str]:
    items = prop.get("items")
    if not isinstance(items, dict):
        return [_('a multi-select needs "items" listing its choices.')]
    if items.get("type") == "object" or "properties" in items:
        return [_("arrays of objects are not supported")]
    if items.get("type", "string") != "string":
        return [_("a multi-select's choices must be text")]
    if "enum" in items:
        variant, choices = "items_enum", items["enum"]
        problems = _choice_list_problems(choices, "items.enum")
    elif "anyOf" in items:
        variant, choices = "items_anyOf", items["anyOf"]
        problems = _option_problems(choices, "items.anyOf")
    else:
        return [_('a multi-select lists its choices in "items.enum" or "items.anyOf".')]
    problems += [_unsupported(None, f"items.{key}") for key in items if key not in _KEYS[variant]]
    return problems or _item_count_problems(prop, len(choices))


def _item_count_problems(prop: dict[str, Any], choice_count: int) -> list[str]:
    problems = [
        _("%(keyword)s must be a whole number, 0 or more") % {"keyword": quote(key)}
        for key in ("minItems", "maxItems")
        if key in prop and not _is_count(prop[key])
    ]
    if "uniqueItems" in prop and not isinstance(prop["uniqueItems"], bool):
        problems.append(_("%(keyword)s must be true or false") % {"keyword": quote("uniqueItems")})
    if problems:
        return problems
    low = prop.get("minItems", 0)
    if low > prop.get("maxItems", math.inf):
        problems.append(_('"minItems" is larger than "maxItems".'))
    if low > choice_count:
        problems.append(_('"minItems" asks for more choices than there are.'))
    return problems


_VARIANT_CHECKS = {
    "string": _string_problems,
    "enum": _enum_problems,
    "oneOf": _one_of_problems,
    "number": _number_problems,
    "boolean": _boolean_problems,
    "array": _array_problems,
}


# -- whole-schema checks for schemas already inside the subset


def _dialect_problems(schema: dict[str, Any]) -> list[str]:
    """Titled choices under a declared JSON Schema version without `const` (draft 4 and older): its validator
    reads each {const, title} option as a schema that any value matches, so one option let any text through
    and two made every answer invalid, the listed ones included."""
    if "const" in validator_for(schema).VALIDATORS:
        return []
    return [
        _field(
            name, _('titled choices need JSON Schema draft 6 or later, and "$schema" declares an older one')
        )
        for name, prop in schema.get("properties", {}).items()
        if "oneOf" in prop or "anyOf" in (prop.get("items") or {})
    ]


def _metaschema_problems(schema: dict[str, Any]) -> list[str]:
    # Only schemas already inside the form subset get here: shallow, plain JSON.
    detail = _metaschema_error(_Canonical(json.dumps(_one_option_each(schema), sort_keys=True)))
    if detail is None:
        return []
    return [_("The form description is not valid JSON Schema: %(detail)s") % {"detail": detail}]


def _one_option_each(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as the metaschema needs to see it: each list of titled options cut to its first. The
    options were checked above to be alike ({const: text, title: text}) and the metaschema judges each by the
    same rules, but it takes most of a millisecond over each one: 100 fields of 200 options took over ten
    seconds, paid again for every schema a server varies by a word."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return schema
    cut = {}
    for name, prop in props.items():
        if "oneOf" in prop:
            prop = {**prop, "oneOf": prop["oneOf"][:1]}
        items = prop.get("items")
        if isinstance(items, dict) and "anyOf" in items:
            prop = {**prop, "items": {**items, "anyOf": items["anyOf"][:1]}}
        cut[name] = prop
    return {**schema, "properties": cut}


class _Canonical:
    """A schema's canonical JSON text, equal to another by its sha256: as a cache key it keeps the digest
    only (a tool's inputSchema may be megabytes, and the cache holds 512 keys)."""

    __slots__ = ("digest", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.digest = hashlib.sha256(text.encode()).digest()

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Canonical) and other.digest == self.digest


@functools.lru_cache(maxsize=512)
def _metaschema_error(canonical: _Canonical) -> str | None:
    """The metaschema's complaint about a schema, or None. Checking against the metaschema is the costliest
    step here, and the same few schemas come back with every round and every answer: remembered by the
    digest of their canonical text."""
    schema = json.loads(canonical.text)
    canonical.text = ""  # this object stays in the cache as the key: its digest is all it needs
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as error:
        return str(error.message)
    return None


def _default_problems(schema: dict[str, Any]) -> list[str]:
    """A server's default must itself be a valid answer: we prefill it and may send it as is. A null default
    is no default (FastMCP writes one for a field declared `= None`): the field starts empty."""
    validator_cls = validator_for(schema)
    problems = []
    for name, prop in schema.get("properties", {}).items():
        if prop.get("default") is not None:
            problem = answer_problem(prop, prop["default"], validator_cls)
            if problem:
                message = _("the default is not valid (%(problem)s)") % {"problem": problem}
                problems.append(_field(name, message))
    return problems
