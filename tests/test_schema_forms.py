"""Unit tests for approvals.schema_forms: requestedSchema -> form -> content. No database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from approvals.schema_forms import (
    NON_FIELD,
    RADIO_LIMIT,
    Field,
    UnsupportedSchema,
    check_schema,
    clean,
    coerce,
    defaults,
    fields,
    humanize,
    is_confirmation,
    sensitive_fields,
    validate,
)
from approvals.schema_forms.timezones import resolve_tz, split_datetime, to_rfc3339

OMITTED = object()  # marks "no key in content"


def form(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


class PostData:
    """A QueryDict stand-in: getlist() over a dict of lists."""

    def __init__(self, values: dict[str, list[str]]):
        self.values = values

    def getlist(self, key: str) -> list[str]:
        return list(self.values.get(key, []))


# Every shape of the restricted subset, as a server would send it.
SHAPES: dict[str, dict[str, Any]] = {
    "text": {"type": "string", "title": "Reason"},
    "text_limits": {"type": "string", "minLength": 2, "maxLength": 5},
    "email": {"type": "string", "format": "email"},
    "uri": {"type": "string", "format": "uri"},
    "date": {"type": "string", "format": "date"},
    "datetime": {"type": "string", "format": "date-time"},
    "number": {"type": "number", "minimum": -1.5, "maximum": 10},
    "integer": {"type": "integer", "minimum": 1, "maximum": 5},
    "boolean": {"type": "boolean", "default": True},
    "untitled_single": {"type": "string", "enum": ["red", "green", "blue"]},
    "titled_single": {
        "type": "string",
        "oneOf": [{"const": "p", "title": "Production"}, {"const": "s", "title": "Staging"}],
    },
    "legacy_enum_names": {"type": "string", "enum": ["a", "b"], "enumNames": ["Alpha", "Beta"]},
    "untitled_multi": {
        "type": "array",
        "items": {"type": "string", "enum": ["x", "y", "z"]},
        "minItems": 1,
        "maxItems": 2,
    },
    "titled_multi": {
        "type": "array",
        "items": {"anyOf": [{"const": "r", "title": "Read"}, {"const": "w", "title": "Write"}]},
    },
    "with_default": {"type": "string", "default": "hello", "description": "Say hi"},
}


# -- check_schema: what is accepted


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_supported_shape_is_accepted_alone_and_required(shape: str) -> None:
    assert check_schema(form({"f": SHAPES[shape]})) == []
    assert check_schema(form({"f": SHAPES[shape]}, required=("f",))) == []


def test_all_shapes_together_are_accepted() -> None:
    assert check_schema(form(SHAPES, required=tuple(SHAPES))) == []


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},  # no properties at all: a plain confirmation
        {"type": "object", "properties": {}},
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "properties": {}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {}},
        {"type": "object", "title": "Deploy", "description": "d", "properties": {}},  # Pydantic adds title
        {"type": "object", "additionalProperties": False, "properties": {"a": {"type": "string"}}},
        form({"a": {"type": "string", "examples": ["x"], "$comment": "internal"}}),
        form({"a": {"type": "string", "oneOf": [{"const": "v"}]}}),  # untitled option: labelled by value
    ],
)
def test_harmless_extras_are_accepted(schema: dict[str, Any]) -> None:
    assert check_schema(schema) == []


# -- check_schema: what is refused, and that it says why


def _deep(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["a"] = {}
        node = node["a"]
    return root


def _cyclic() -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    node["self"] = node
    return form({"a": node})


HOSTILE = [
    ("not a dict", [], "must be a JSON object"),
    ("a string", "type: object", "must be a JSON object"),
    ("None", None, "must be a JSON object"),
    ("wrong top type", {"type": "array", "properties": {}}, '"type": "object"'),
    (
        "nested object",
        form({"a": {"type": "object", "properties": {"b": {"type": "string"}}}}),
        "nested objects",
    ),
    ("$ref", form({"a": {"$ref": "#/$defs/a"}}), "“$ref” is not supported"),
    ("$defs", {**form({}), "$defs": {"a": {"type": "string"}}}, "“$defs” is not supported"),
    ("pattern", form({"a": {"type": "string", "pattern": "^x$"}}), "“pattern” is not supported"),
    (
        "array of objects",
        form({"a": {"type": "array", "items": {"type": "object", "properties": {}}}}),
        "arrays of objects",
    ),
    ("optional via anyOf", form({"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}), "“anyOf” is not"),
    ("allOf", form({"a": {"type": "string", "allOf": [{"minLength": 1}]}}), "“allOf” is not supported"),
    ("type list", form({"a": {"type": ["string", "null"]}}), "exactly one type"),
    ("no type", form({"a": {"title": "A"}}), "has no type"),
    ("property not an object", form({"a": "string"}), "must be described by a JSON object"),
    ("unknown format", form({"a": {"type": "string", "format": "hostname"}}), "only the formats"),
    ("unknown keyword", form({"a": {"type": "number", "multipleOf": 2}}), "“multipleOf” is not supported"),
    ("minLength as text", form({"a": {"type": "string", "minLength": "3"}}), "“minLength” must be a whole"),
    ("minLength as bool", form({"a": {"type": "string", "minLength": True}}), "“minLength” must be a whole"),
    ("negative maxLength", form({"a": {"type": "string", "maxLength": -1}}), "“maxLength” must be a whole"),
    ("min > max length", form({"a": {"type": "string", "minLength": 5, "maxLength": 2}}), "larger than"),
    (
        "huge minLength",
        form({"a": {"type": "string", "minLength": 10**6}}),
        '"minLength" is larger than 10000',
    ),
    ("enum of numbers", form({"a": {"type": "string", "enum": [1, 2]}}), "must contain only text"),
    ("empty enum", form({"a": {"type": "string", "enum": []}}), "non-empty list"),
    ("duplicate enum", form({"a": {"type": "string", "enum": ["x", "x"]}}), "twice"),
    ("empty choice", form({"a": {"type": "string", "enum": ["", "x"]}}), "empty choice"),
    (
        "too many choices",
        form({"a": {"type": "string", "enum": [str(i) for i in range(501)]}}),
        "more than 500",
    ),
    (
        "enumNames mismatch",
        form({"a": {"type": "string", "enum": ["x", "y"], "enumNames": ["X"]}}),
        "one label per",
    ),
    ("enumNames not text", form({"a": {"type": "string", "enum": ["x"], "enumNames": [1]}}), "list of text"),
    ("oneOf extra key", form({"a": {"type": "string", "oneOf": [{"const": "x", "x": 1}]}}), "not supported"),
    ("oneOf not options", form({"a": {"type": "string", "oneOf": ["x"]}}), "{const, title}"),
    ("oneOf const not text", form({"a": {"type": "string", "oneOf": [{"const": 1}]}}), "only text"),
    ("minimum as text", form({"a": {"type": "number", "minimum": "1"}}), "“minimum” must be a number"),
    ("maximum as bool", form({"a": {"type": "integer", "maximum": True}}), "“maximum” must be a number"),
    ("min > max", form({"a": {"type": "number", "minimum": 5, "maximum": 1}}), "larger than"),
    ("no whole number", form({"a": {"type": "integer", "minimum": 1.2, "maximum": 1.8}}), "no whole number"),
    ("infinite bound", form({"a": {"type": "number", "maximum": float("inf")}}), "not finite"),
    ("NaN bound", form({"a": {"type": "number", "minimum": float("nan")}}), "not finite"),
    ("default wrong type", form({"a": {"type": "number", "default": "5"}}), "default is not valid"),
    ("bool default for integer", form({"a": {"type": "integer", "default": True}}), "default is not valid"),
    ("default out of range", form({"a": {"type": "integer", "maximum": 3, "default": 7}}), "at most 3"),
    (
        "default not a choice",
        form({"a": {"type": "string", "enum": ["x"], "default": "y"}}),
        "default is not",
    ),
    (
        "string default on boolean",
        form({"a": {"type": "boolean", "default": "true"}}),
        "default is not valid",
    ),
    (
        "multi default not a choice",
        form({"a": {"type": "array", "items": {"enum": ["x"]}, "default": ["y"]}}),
        "default is not valid",
    ),
    (
        "bad email default",
        form({"a": {"type": "string", "format": "email", "default": "a@"}}),
        "default is not",
    ),
    ("multi without items", form({"a": {"type": "array"}}), 'needs "items"'),
    ("multi of numbers", form({"a": {"type": "array", "items": {"type": "number"}}}), "must be text"),
    ("multi without choices", form({"a": {"type": "array", "items": {"type": "string"}}}), "items.enum"),
    (
        "minItems above choices",
        form({"a": {"type": "array", "items": {"enum": ["x"]}, "minItems": 2}}),
        "more choices than there are",
    ),
    (
        "minItems > maxItems",
        form({"a": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 1}}),
        '"minItems" is larger',
    ),
    ("title not text", form({"a": {"type": "string", "title": 5}}), "“title” must be text"),
    ("required not a list", {**form({"a": {"type": "string"}}), "required": "a"}, "list of field names"),
    ("required unknown", form({"a": {"type": "string"}}, required=("b",)), "not a field"),
    ("required twice", form({"a": {"type": "string"}}, required=("a", "a")), "twice"),
    ("properties not object", {"type": "object", "properties": []}, '"properties" must be an object'),
    ("10k properties", form({f"p{i}": {"type": "string"} for i in range(10_000)}), "more than 100 fields"),
    ("reserved name", form({NON_FIELD: {"type": "string"}}), "reserved"),
    ("empty name", form({" ": {"type": "string"}}), "empty name"),
    ("control char in name", form({"a\nb": {"type": "string"}}), "control characters"),
    ("long name", form({"n" * 101: {"type": "string"}}), "longer than 100"),
    (
        "unknown $schema",
        {**form({}), "$schema": "https://evil.example/schema"},
        "unknown JSON Schema version",
    ),
    ("$schema not text", {**form({}), "$schema": ["x"]}, "unknown JSON Schema version"),
    ("open additionalProperties", {**form({}), "additionalProperties": True}, "additionalProperties"),
    ("huge description", form({"a": {"type": "string", "description": "d" * 10_001}}), "longer than 10000"),
    ("NUL in text", form({"a": {"type": "string", "title": "a\x00"}}), "null character"),
    ("deep nesting", _deep(5_000), "nested too deeply"),
    ("cycle", _cyclic(), "nested too deeply"),
    ("not JSON", form({"a": {"type": "string", "enum": {"x", "y"}}}), "not valid JSON"),
    ("non-text key", {"type": "object", "properties": {1: {"type": "string"}}}, "key is not text"),
    ("too many nodes", form({"a": {"type": "string", "examples": list(range(200_000))}}), "too large"),
    (
        "draft-03 shape",
        {**form({"a": {"type": "string"}}, ("a",)), "$schema": "http://json-schema.org/draft-03/schema#"},
        "not valid JSON Schema",
    ),
]


@pytest.mark.parametrize(
    ("schema", "expected"), [(s, e) for _, s, e in HOSTILE], ids=[i for i, _, _ in HOSTILE]
)
def test_unsupported_schemas_are_refused_with_a_reason(schema: object, expected: str) -> None:
    problems = check_schema(schema)
    assert problems, "the schema should have been refused"
    assert any(expected in problem for problem in problems), problems


def test_the_metaschema_check_is_remembered_per_schema_and_still_refuses() -> None:
    from approvals.schema_forms import checking

    draft3 = {**form({"a": {"type": "string"}}, ("a",)), "$schema": "http://json-schema.org/draft-03/schema#"}
    good = form({"b": {"type": "integer", "minimum": 1}}, ("b",))
    checking._metaschema_error.cache_clear()

    first = [check_schema(good), check_schema(draft3)]
    # The same schemas again, one with its keys in another order: the same answers, from memory.
    again = [check_schema(dict(reversed(list(good.items())))), check_schema(draft3)]

    assert first == again
    assert first[0] == [] and "not valid JSON Schema" in first[1][0]
    info = checking._metaschema_error.cache_info()
    assert (info.misses, info.hits) == (2, 2)


def test_problem_list_is_capped() -> None:
    schema = form({f"p{i}": {"type": "string", "pattern": "x"} for i in range(60)})
    problems = check_schema(schema)
    assert len(problems) == 21
    assert problems[-1] == "...and 40 more problems"


@pytest.mark.parametrize("function", [fields, defaults, is_confirmation])
def test_render_functions_raise_on_unsupported_schema(function: Any) -> None:
    with pytest.raises(UnsupportedSchema) as raised:
        function(form({"a": {"$ref": "#/x"}}))
    assert any("$ref" in problem for problem in raised.value.problems)


def test_coerce_raises_on_unsupported_schema() -> None:
    with pytest.raises(UnsupportedSchema):
        coerce({"type": "object", "properties": {"a": {"type": "object"}}}, {})


# -- fields(): labels, kinds, widgets, hints


@pytest.mark.parametrize(
    ("key", "label"),
    [
        ("start_date", "Start date"),
        ("startDate", "Start date"),
        ("user_id", "User ID"),
        ("APIKey", "API key"),
        ("API_KEY", "API key"),
        ("callback-url", "Callback URL"),
        ("max_SLA_hours", "Max SLA hours"),
        ("name", "Name"),
        ("___", "___"),
    ],
)
def test_labels_from_keys(key: str, label: str) -> None:
    assert humanize(key) == label
    assert fields(form({key: {"type": "string"}}))[0].label == label


def test_title_wins_over_key_and_blank_title_falls_back() -> None:
    titled, blank = fields(
        form({"a_b": {"type": "string", "title": " Reason "}, "c_d": {"type": "string", "title": ""}})
    )
    assert (titled.label, blank.label) == ("Reason", "C d")


FIELD_EXPECTATIONS = [
    # shape, kind, widget, html_input_type, inputmode, choices
    ("text", "text", "input", "text", "", []),
    ("email", "email", "input", "email", "", []),
    ("uri", "url", "input", "url", "", []),
    ("date", "date", "input", "date", "", []),
    ("datetime", "datetime", "input", "datetime-local", "", []),
    ("number", "number", "input", "text", "", []),  # negative allowed: keep the full keyboard
    ("integer", "integer", "input", "text", "numeric", []),
    ("boolean", "boolean", "checkbox", "checkbox", "", []),
    (
        "untitled_single",
        "single_select",
        "radios",
        "radio",
        "",
        [("red", "red"), ("green", "green"), ("blue", "blue")],
    ),
    ("titled_single", "single_select", "radios", "radio", "", [("p", "Production"), ("s", "Staging")]),
    ("legacy_enum_names", "single_select", "radios", "radio", "", [("a", "Alpha"), ("b", "Beta")]),
    ("untitled_multi", "multi_select", "checkboxes", "checkbox", "", [("x", "x"), ("y", "y"), ("z", "z")]),
    ("titled_multi", "multi_select", "checkboxes", "checkbox", "", [("r", "Read"), ("w", "Write")]),
]


@pytest.mark.parametrize(
    ("shape", "kind", "widget", "input_type", "inputmode", "choices"),
    FIELD_EXPECTATIONS,
    ids=[row[0] for row in FIELD_EXPECTATIONS],
)
def test_field_description_per_shape(
    shape: str, kind: str, widget: str, input_type: str, inputmode: str, choices: list[tuple[str, str]]
) -> None:
    (field,) = fields(form({"f": SHAPES[shape]}, required=("f",)))
    assert isinstance(field, Field)
    assert (field.name, field.kind, field.widget) == ("f", kind, widget)
    assert (field.html_input_type, field.inputmode, field.choices) == (input_type, inputmode, choices)
    assert field.required is True


def test_fields_keep_schema_order_and_carry_limits() -> None:
    described = fields(form(SHAPES, required=("integer",)))
    assert [f.name for f in described] == list(SHAPES)
    by_name = {f.name: f for f in described}
    assert (by_name["text_limits"].min_length, by_name["text_limits"].max_length) == (2, 5)
    assert (by_name["integer"].minimum, by_name["integer"].maximum) == (1, 5)
    assert (by_name["untitled_multi"].min_items, by_name["untitled_multi"].max_items) == (1, 2)
    assert by_name["integer"].required and not by_name["text"].required
    assert by_name["with_default"].description == "Say hi"
    assert [f.html_id for f in described[:2]] == ["field-0", "field-1"]


def test_number_inputmode_decimal_when_not_negative() -> None:
    (field,) = fields(form({"f": {"type": "number", "minimum": 0}}))
    assert field.inputmode == "decimal"


@pytest.mark.parametrize(("count", "widget"), [(RADIO_LIMIT, "radios"), (RADIO_LIMIT + 1, "select")])
def test_radios_up_to_seven_choices_then_a_select(count: int, widget: str) -> None:
    options = [str(i) for i in range(count)]
    untitled, titled = fields(
        form(
            {
                "u": {"type": "string", "enum": options},
                "t": {"type": "string", "oneOf": [{"const": o, "title": f"Option {o}"} for o in options]},
            }
        )
    )
    assert untitled.widget == titled.widget == widget
    assert untitled.html_input_type == ("radio" if widget == "radios" else "")
    assert len(titled.choices) == count


@pytest.mark.parametrize(
    ("prop", "hint"),
    [
        ({"type": "integer", "minimum": 1, "maximum": 10}, "Whole number, between 1 and 10"),
        ({"type": "integer"}, "Whole number"),
        ({"type": "number", "minimum": 1.5, "maximum": 10.0}, "Between 1.5 and 10"),
        ({"type": "number", "minimum": 0}, "At least 0"),
        ({"type": "number", "maximum": 7}, "At most 7"),
        ({"type": "number"}, ""),
        ({"type": "string", "maxLength": 40}, "At most 40 characters"),
        ({"type": "string", "minLength": 1}, "At least 1 character"),
        ({"type": "string", "minLength": 3, "maxLength": 3}, "Exactly 3 characters"),
        ({"type": "string", "minLength": 0}, ""),
        ({"type": "string", "format": "date"}, "For example 2026-12-02"),
        ({"type": "array", "items": {"enum": ["a", "b", "c", "d"]}, "maxItems": 3}, "At most 3 choices"),
        ({"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1}, "At least 1 choice"),
        (
            {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 2},
            "Between 1 and 2 choices",
        ),
    ],
)
def test_hints_list_the_limits(prop: dict[str, Any], hint: str) -> None:
    assert fields(form({"f": prop}))[0].hint == hint


@pytest.mark.parametrize(
    ("prop", "initial"),
    [
        ({"type": "string", "default": "hello"}, "hello"),
        ({"type": "string"}, ""),
        ({"type": "number", "default": 2.0}, "2"),
        ({"type": "number", "default": 1.5}, "1.5"),
        ({"type": "boolean", "default": True}, True),
        ({"type": "boolean"}, False),
        ({"type": "array", "items": {"enum": ["a", "b"]}, "default": ["b"]}, ["b"]),
        ({"type": "array", "items": {"enum": ["a", "b"]}}, []),
        ({"type": "string", "enum": ["a", "b"], "default": "b"}, "b"),
    ],
)
def test_initial_values_prefill_the_default(prop: dict[str, Any], initial: object) -> None:
    (field,) = fields(form({"f": prop}))
    assert field.initial == initial
    assert field.default == prop.get("default")


def test_datetime_default_is_shown_in_the_reviewers_zone_or_its_own_offset() -> None:
    schema = form({"at": {"type": "string", "format": "date-time", "default": "2026-12-02T10:30:00Z"}})
    in_tokyo = fields(schema, tz="Asia/Tokyo")[0]
    assert (in_tokyo.initial, in_tokyo.initial_tz) == ("2026-12-02T19:30", "Asia/Tokyo")
    as_sent = fields(schema)[0]
    assert (as_sent.initial, as_sent.initial_tz) == ("2026-12-02T10:30", "+00:00")
    # Posting the prefilled value back with its zone gives the same instant.
    content, errors = coerce(schema, {"at": [in_tokyo.initial]}, tz=in_tokyo.initial_tz)
    assert errors == {}
    assert datetime.fromisoformat(content["at"]) == datetime(2026, 12, 2, 10, 30, tzinfo=UTC)


def test_prefix_names_the_posted_inputs() -> None:
    schema = form({"action": {"type": "string"}})
    assert fields(schema, prefix="f-")[0].html_name == "f-action"
    content, _errors = coerce(schema, {"action": ["approve"], "f-action": ["typed"]}, prefix="f-")
    assert content == {"action": "typed"}


# -- sensitive fields


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("api_key", {"type": "string"}),
        ("apiKey", {"type": "string"}),
        ("password", {"type": "string"}),
        ("user_password", {"type": "string"}),
        ("passwd", {"type": "string"}),
        ("card_number", {"type": "string"}),
        ("cardNumber", {"type": "string"}),
        ("cvv", {"type": "string"}),
        ("pin", {"type": "string"}),
        ("client_secret", {"type": "string"}),
        ("access_token", {"type": "string"}),
        ("iban", {"type": "string"}),
        ("otp", {"type": "string"}),
        ("value", {"type": "string", "title": "Your GitHub token"}),
        ("value", {"type": "string", "description": "Paste the private key here"}),
        ("value", {"type": "string", "title": "Mot de passe"}),
        ("value", {"type": "string", "title": "رمز عبور"}),  # Persian, a language the hub ships
        ("value", {"type": "string", "title": "Passwort"}),
    ],
)
def test_credentials_are_flagged(name: str, prop: dict[str, Any]) -> None:
    schema = form({name: prop})
    assert fields(schema)[0].sensitive is True
    assert sensitive_fields(schema) == [name]


@pytest.mark.parametrize(
    "name",
    [
        "name",
        "email",
        "username",
        "user_name",
        "login",
        "max_tokens",
        "passport_country",
        "spinner",
        "keyboard",
    ],
)
def test_ordinary_fields_are_not_flagged(name: str) -> None:
    schema = form({name: {"type": "string"}})
    assert fields(schema)[0].sensitive is False
    assert sensitive_fields(schema) == []


@pytest.mark.parametrize(
    ("schema", "flagged"),
    [
        (form({"password": {"type": "string", "pattern": "x"}, "name": {"type": "string"}}), ["password"]),
        (form({"token": "not an object", "title": {"title": 5}}), ["token"]),
        ({"type": "object", "properties": ["password"]}, []),
        (None, []),
    ],
)
def test_sensitive_fields_is_best_effort_on_unsupported_schemas(schema: object, flagged: list[str]) -> None:
    # It also serves redaction in audit logs, so it must not raise.
    assert sensitive_fields(schema) == flagged


# -- confirmation


@pytest.mark.parametrize(
    ("schema", "confirmation"),
    [
        ({"type": "object"}, True),
        ({"type": "object", "properties": {}}, True),
        (form({"proceed": {"type": "boolean"}}), False),  # a lone boolean is still a real question
        (form({"reason": {"type": "string"}}), False),
    ],
)
def test_is_confirmation(schema: dict[str, Any], confirmation: bool) -> None:
    assert is_confirmation(schema) is confirmation


def test_confirmation_answers() -> None:
    schema = {"type": "object"}
    assert fields(schema) == []
    assert coerce(schema, {"csrfmiddlewaretoken": ["t"]}) == ({}, {})
    assert validate(schema, {}) == {}
    assert defaults(schema) == {}


# -- coerce: form strings to JSON types


COERCE_CASES = [
    # id, property, required, posted values, expected value (OMITTED = left out), expected error
    ("text", {"type": "string"}, False, ["  hi  "], "hi", None),
    ("textarea CRLF", {"type": "string"}, False, ["a\r\nb"], "a\nb", None),
    ("empty optional text", {"type": "string"}, False, [""], OMITTED, None),
    ("blank optional text", {"type": "string"}, False, ["   "], OMITTED, None),
    ("absent optional text", {"type": "string"}, False, [], OMITTED, None),
    ("empty required text", {"type": "string"}, True, [""], OMITTED, "This field is required"),
    ("two values", {"type": "string"}, False, ["a", "b"], OMITTED, "Enter only one value"),
    ("integer", {"type": "integer"}, True, ["42"], 42, None),
    ("negative integer", {"type": "integer"}, True, ["-7"], -7, None),
    ("big integer stays exact", {"type": "integer"}, True, ["9007199254740993"], 9007199254740993, None),
    ("integer typo", {"type": "integer"}, True, ["2o"], OMITTED, "Enter a whole number"),
    ("integer with decimals", {"type": "integer"}, True, ["1.0"], OMITTED, "Enter a whole number"),
    ("integer with exponent", {"type": "integer"}, True, ["1e3"], OMITTED, "Enter a whole number"),
    ("integer underscores", {"type": "integer"}, True, ["1_000"], OMITTED, "Enter a whole number"),
    ("empty optional integer", {"type": "integer"}, False, [""], OMITTED, None),
    ("empty required integer", {"type": "integer"}, True, [""], OMITTED, "This field is required"),
    ("decimal", {"type": "number"}, True, ["1.5"], 1.5, None),
    ("negative whole number", {"type": "number"}, True, ["-2"], -2, None),
    ("leading point", {"type": "number"}, True, [".5"], 0.5, None),
    ("exponent", {"type": "number"}, True, ["1e3"], 1000.0, None),
    ("letters", {"type": "number"}, True, ["abc"], OMITTED, "Enter a number"),
    ("NaN", {"type": "number"}, True, ["NaN"], OMITTED, "Enter a number"),
    ("inf", {"type": "number"}, True, ["inf"], OMITTED, "Enter a number"),
    ("overflow", {"type": "number"}, True, ["1e999"], OMITTED, "Enter a smaller number"),
    (
        "decimal comma",
        {"type": "number"},
        True,
        ["1,5"],
        OMITTED,
        "Enter a number, using a point for decimals (1.5)",
    ),
    ("checked", {"type": "boolean"}, False, ["on"], True, None),
    ("checked true", {"type": "boolean"}, True, ["true"], True, None),
    ("hidden false + checkbox", {"type": "boolean"}, True, ["false", "true"], True, None),
    ("unchecked optional", {"type": "boolean"}, False, [], False, None),
    ("unchecked required", {"type": "boolean"}, True, [], False, None),
    ("unchecked default true", {"type": "boolean", "default": True}, False, [], False, None),
    ("boolean garbage", {"type": "boolean"}, False, ["maybe"], OMITTED, "Must be true or false"),
    ("single select", {"type": "string", "enum": ["a", "b"]}, True, ["b"], "b", None),
    ("choice kept verbatim", {"type": "string", "enum": [" a ", "b"]}, True, [" a "], " a ", None),
    ("single select none", {"type": "string", "enum": ["a", "b"]}, False, [""], OMITTED, None),
    (
        "single select required",
        {"type": "string", "enum": ["a"]},
        True,
        [],
        OMITTED,
        "This field is required",
    ),
    ("multi select", {"type": "array", "items": {"enum": ["a", "b"]}}, False, ["a", "b"], ["a", "b"], None),
    ("multi select none optional", {"type": "array", "items": {"enum": ["a"]}}, False, [], OMITTED, None),
    ("multi select none required", {"type": "array", "items": {"enum": ["a"]}}, True, [], [], None),
    ("date", {"type": "string", "format": "date"}, True, ["2026-12-02"], "2026-12-02", None),
    (
        "not a date",
        {"type": "string", "format": "date"},
        True,
        ["02/12/2026"],
        OMITTED,
        "Enter a date as YYYY-MM-DD, like 2026-12-02",
    ),
    (
        "impossible date",
        {"type": "string", "format": "date"},
        True,
        ["2026-02-30"],
        OMITTED,
        "Enter a real date",
    ),
    (
        "email kept as typed",
        {"type": "string", "format": "email"},
        True,
        [" a@example.com "],
        "a@example.com",
        None,
    ),
]


@pytest.mark.parametrize(
    ("prop", "required", "posted", "expected", "error"),
    [case[1:] for case in COERCE_CASES],
    ids=[case[0] for case in COERCE_CASES],
)
def test_coerce(
    prop: dict[str, Any], required: bool, posted: list[str], expected: object, error: str | None
) -> None:
    schema = form({"f": prop}, required=("f",) if required else ())
    for data in ({"f": posted}, PostData({"f": posted})):
        content, errors = coerce(schema, data)
        assert errors == ({"f": error} if error else {})
        if expected is OMITTED:
            assert "f" not in content
        else:
            assert content == {"f": expected}
            assert type(content["f"]) is type(expected)  # 2 stays an int, True stays a bool


def test_coerce_accepts_a_plain_string_mapping_and_ignores_unknown_keys() -> None:
    schema = form({"a": {"type": "integer"}})
    assert coerce(schema, {"a": "3", "csrfmiddlewaretoken": "x", "tz": "UTC"}) == ({"a": 3}, {})


def test_empty_optional_form() -> None:
    content, errors = coerce(form(SHAPES), {})
    assert errors == {}
    assert content == {"boolean": False}  # only the rendered checkbox answers
    assert validate(form(SHAPES), content) == {}


# -- date-times and time zones


@pytest.mark.parametrize(
    ("posted", "tz", "expected", "error"),
    [
        ("2026-12-02T10:30", "Europe/Paris", "2026-12-02T10:30:00+01:00", None),
        ("2026-07-02T10:30", "Europe/Paris", "2026-07-02T10:30:00+02:00", None),  # summer time
        ("2026-12-02T10:30:15", "+05:30", "2026-12-02T10:30:15+05:30", None),
        ("2026-12-02 10:30", "-0800", "2026-12-02T10:30:00-08:00", None),
        ("2026-12-02T10:30", "UTC", "2026-12-02T10:30:00+00:00", None),
        ("2026-12-02T10:30+09:00", "Europe/Paris", "2026-12-02T10:30:00+09:00", None),  # own offset wins
        ("2026-12-02t10:30:00z", None, "2026-12-02T10:30:00+00:00", None),
        ("2026-12-02T10:30", None, None, "Choose a time zone"),
        ("2026-12-02T10:30", "", None, "Choose a time zone"),
        ("2026-12-02T10:30", "Mars/Olympus", None, "Unknown time zone"),
        ("2026-12-02T10:30", "../../etc/passwd", None, "Unknown time zone"),
        ("2026-12-02T10:30", "+25:00", None, "Unknown time zone"),
        ("2026-12-02", "UTC", None, "Enter a date and time, like 2026-12-02 10:30"),
        ("tomorrow", "UTC", None, "Enter a date and time, like 2026-12-02 10:30"),
        ("2026-13-02T10:30", "UTC", None, "Enter a real date and time"),
        (
            "2026-03-29T02:30",
            "Europe/Paris",
            None,
            "This time does not exist in Europe/Paris (the clocks go forward)",
        ),
        (
            "2026-10-25T02:30",
            "Europe/Paris",
            None,
            "This time happens twice in Europe/Paris (the clocks go back); add the UTC offset",
        ),
        ("2026-10-25T02:30+01:00", "Europe/Paris", "2026-10-25T02:30:00+01:00", None),
    ],
)
def test_datetime_needs_an_explicit_zone(
    posted: str, tz: str | None, expected: str | None, error: str | None
) -> None:
    assert to_rfc3339(posted, tz) == (expected, error)
    schema = form({"at": {"type": "string", "format": "date-time"}}, required=("at",))
    content, errors = clean(schema, {"at": [posted]}, tz=tz)
    if error:
        assert errors == {"at": error}
    else:
        assert (content, errors) == ({"at": expected}, {})


@pytest.mark.parametrize("tz", ["Europe/Paris", "America/New_York", "+01:00", "Z", "utc"])
def test_resolve_tz_accepts_zones_and_offsets(tz: str) -> None:
    assert resolve_tz(tz) is not None


def test_split_datetime_keeps_seconds_and_offset() -> None:
    assert split_datetime("2026-12-02T10:30:15-05:00", None) == ("2026-12-02T10:30:15", "-05:00")


# -- validate: content from the API or the browser


VALIDATE_CASES = [
    # id, property, value, expected message (None = valid)
    ("text", {"type": "string"}, "ok", None),
    ("number for text", {"type": "string"}, 5, "Enter text"),
    ("minLength exact", {"type": "string", "minLength": 2}, "ab", None),
    ("minLength one short", {"type": "string", "minLength": 2}, "a", "Enter at least 2 characters"),
    ("maxLength exact", {"type": "string", "maxLength": 3}, "abc", None),
    ("maxLength one past", {"type": "string", "maxLength": 3}, "abcd", "Enter at most 3 characters"),
    ("maxLength 1", {"type": "string", "maxLength": 1}, "ab", "Enter at most 1 character"),
    ("code points not bytes", {"type": "string", "maxLength": 2}, "ñé", None),
    ("NUL", {"type": "string"}, "a\x00b", "Remove the null character"),
    ("hub length cap", {"type": "string"}, "x" * 100_001, "Enter at most 100000 characters"),
    ("email", {"type": "string", "format": "email"}, "ada@example.com", None),
    (
        "email without domain",
        {"type": "string", "format": "email"},
        "ada@",
        "Enter an email address like name@example.com",
    ),
    (
        "email no at",
        {"type": "string", "format": "email"},
        "ada",
        "Enter an email address like name@example.com",
    ),
    ("uri", {"type": "string", "format": "uri"}, "https://example.com/a?b=c", None),
    (
        "uri without scheme",
        {"type": "string", "format": "uri"},
        "example.com",
        "Enter a full web address like https://example.com",
    ),
    (
        "uri with space",
        {"type": "string", "format": "uri"},
        "https://exa mple.com",
        "Enter a full web address like https://example.com",
    ),
    ("date", {"type": "string", "format": "date"}, "2026-12-02", None),
    (
        "impossible date",
        {"type": "string", "format": "date"},
        "2026-02-30",
        "Enter a real date as YYYY-MM-DD",
    ),
    ("date-time", {"type": "string", "format": "date-time"}, "2026-12-02T10:30:00+01:00", None),
    ("date-time Z", {"type": "string", "format": "date-time"}, "2026-12-02T10:30:00Z", None),
    (
        "date-time without offset",
        {"type": "string", "format": "date-time"},
        "2026-12-02T10:30:00",
        "Enter a date and time with a time zone, like 2026-12-02T10:30:00+01:00",
    ),
    ("integer at minimum", {"type": "integer", "minimum": 1, "maximum": 5}, 1, None),
    ("integer at maximum", {"type": "integer", "minimum": 1, "maximum": 5}, 5, None),
    ("integer below minimum", {"type": "integer", "minimum": 1, "maximum": 5}, 0, "Must be at least 1"),
    ("integer above maximum", {"type": "integer", "minimum": 1, "maximum": 5}, 6, "Must be at most 5"),
    ("fraction for integer", {"type": "integer"}, 1.5, "Enter a whole number"),
    ("1.0 is a JSON integer", {"type": "integer"}, 1.0, None),
    ("True for integer", {"type": "integer"}, True, "Enter a whole number"),
    ("string for integer", {"type": "integer"}, "3", "Enter a whole number"),
    ("fraction for number (schema.ts)", {"type": "number"}, 2.5, None),
    ("number at bounds", {"type": "number", "minimum": -1.5, "maximum": 10}, -1.5, None),
    ("number just below", {"type": "number", "minimum": -1.5}, -1.51, "Must be at least -1.5"),
    ("number just above", {"type": "number", "maximum": 10.0}, 10.01, "Must be at most 10"),
    ("True for number", {"type": "number"}, True, "Enter a number"),
    ("NaN for number", {"type": "number"}, float("nan"), "Enter a number"),
    ("inf for number", {"type": "number"}, float("inf"), "Enter a number"),
    ("boolean", {"type": "boolean"}, False, None),
    ("text for boolean", {"type": "boolean"}, "true", "Must be true or false"),
    ("1 for boolean", {"type": "boolean"}, 1, "Must be true or false"),
    ("enum", {"type": "string", "enum": ["a", "b"]}, "b", None),
    ("not in enum", {"type": "string", "enum": ["a", "b"]}, "c", "Choose one of the options"),
    (
        "label instead of value",
        {"type": "string", "enum": ["a"], "enumNames": ["Alpha"]},
        "Alpha",
        "Choose one of the options",
    ),
    ("oneOf", SHAPES["titled_single"], "p", None),
    ("oneOf title is not the value", SHAPES["titled_single"], "Production", "Choose one of the options"),
    ("list for single", {"type": "string", "enum": ["a"]}, ["a"], "Choose one of the options"),
    ("multi", SHAPES["untitled_multi"], ["x", "z"], None),
    ("multi at maxItems", SHAPES["untitled_multi"], ["x", "y"], None),
    ("multi past maxItems", SHAPES["untitled_multi"], ["x", "y", "z"], "Choose at most 2 options"),
    ("multi under minItems", SHAPES["untitled_multi"], [], "Choose at least 1 option"),
    ("multi unknown item", SHAPES["untitled_multi"], ["x", "q"], "Choose only from the options"),
    ("multi number item", SHAPES["untitled_multi"], [1], "Choose only from the options"),
    ("multi repeated", SHAPES["untitled_multi"], ["x", "x"], "Choose each option only once"),
    ("multi string", SHAPES["untitled_multi"], "x", "Must be a list of options"),
    ("titled multi", SHAPES["titled_multi"], ["w"], None),
    ("titled multi unknown", SHAPES["titled_multi"], ["Write"], "Choose only from the options"),
]


@pytest.mark.parametrize(
    ("prop", "value", "message"),
    [case[1:] for case in VALIDATE_CASES],
    ids=[case[0] for case in VALIDATE_CASES],
)
def test_validate(prop: dict[str, Any], value: object, message: str | None) -> None:
    errors = validate(form({"f": prop}), {"f": value})
    assert errors == ({"f": message} if message else {})


def test_validate_required_and_optional() -> None:
    schema = form({"a": {"type": "string"}, "b": {"type": "integer"}}, required=("a",))
    assert validate(schema, {}) == {"a": "This field is required"}
    assert validate(schema, {"a": "x"}) == {}


@pytest.mark.parametrize("content", [None, [], "text", 3, [("a", "x")]])
def test_validate_content_must_be_an_object(content: object) -> None:
    assert validate(form({"a": {"type": "string"}}), content) == {
        NON_FIELD: "The answer must be an object of field values"
    }


def test_validate_refuses_unknown_properties() -> None:
    schema = form({"a": {"type": "string"}})
    assert validate(schema, {"a": "x", "zz": 1}) == {NON_FIELD: "Unexpected field: \u201czz\u201d"}
    many = {f"k{i}": 1 for i in range(7)}
    assert validate(schema, many)[NON_FIELD].endswith("and 2 more")


def test_validate_refuses_an_unsupported_schema() -> None:
    errors = validate(form({"a": {"type": "string", "pattern": "x"}}), {"a": "x"})
    assert list(errors) == [NON_FIELD]
    assert errors[NON_FIELD].startswith("This form cannot be answered: ")


def test_validate_content_from_json() -> None:
    schema = form(SHAPES, required=("integer", "number"))
    content = json.loads('{"integer": 3, "number": 2.5, "boolean": false, "untitled_multi": ["x"]}')
    assert validate(schema, content) == {}


def test_clean_reports_both_conversion_and_rule_problems() -> None:
    schema = form(SHAPES, required=("integer",))
    posted = {"integer": ["9"], "number": ["x"], "text_limits": ["a"], "untitled_multi": ["x", "y", "z"]}
    content, errors = clean(schema, posted)
    assert errors == {
        "integer": "Must be at most 5",
        "number": "Enter a number",
        "text_limits": "Enter at least 2 characters",
        "untitled_multi": "Choose at most 2 options",
    }
    assert content["integer"] == 9  # typed values are kept for redisplay


# -- defaults


NOW = datetime(2026, 12, 2, 10, 30, 15, 123, tzinfo=UTC)

DEFAULT_CASES = [
    # id, property, expected value when required and without a default
    ("text", {"type": "string"}, "x"),
    ("text minLength", {"type": "string", "minLength": 4}, "xxxx"),
    ("text maxLength 0", {"type": "string", "maxLength": 0}, ""),
    ("email", {"type": "string", "format": "email"}, "user@example.com"),
    ("short email", {"type": "string", "format": "email", "maxLength": 13}, "a@example.com"),
    ("long email", {"type": "string", "format": "email", "minLength": 20}, "userxxxx@example.com"),
    ("uri", {"type": "string", "format": "uri"}, "https://example.com/"),
    ("date", {"type": "string", "format": "date"}, "2026-12-02"),
    ("date-time", {"type": "string", "format": "date-time"}, "2026-12-02T10:30:15+00:00"),
    ("number", {"type": "number"}, 0),
    ("number minimum", {"type": "number", "minimum": 2.5}, 2.5),
    ("number maximum", {"type": "number", "maximum": -3}, -3),
    ("integer fractional minimum", {"type": "integer", "minimum": 1.2}, 2),
    ("integer fractional maximum", {"type": "integer", "maximum": -1.5}, -2),
    ("boolean", {"type": "boolean"}, False),
    ("enum", SHAPES["untitled_single"], "red"),
    ("oneOf", SHAPES["titled_single"], "p"),
    ("legacy", SHAPES["legacy_enum_names"], "a"),
    ("multi minItems", SHAPES["untitled_multi"], ["x"]),
    ("multi no minimum", SHAPES["titled_multi"], []),
]


@pytest.mark.parametrize(
    ("prop", "expected"), [case[1:] for case in DEFAULT_CASES], ids=[case[0] for case in DEFAULT_CASES]
)
def test_defaults_invent_valid_values_for_required_fields(prop: dict[str, Any], expected: object) -> None:
    schema = form({"f": prop}, required=("f",))
    content = defaults(schema, now=NOW)
    assert content == {"f": expected}
    assert validate(schema, content) == {}


def test_defaults_use_server_defaults_and_skip_optional_fields() -> None:
    schema = form(
        {
            "greeting": SHAPES["with_default"],
            "notify": SHAPES["boolean"],
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "default": ["b"]},
            "note": {"type": "string"},
        }
    )
    content = defaults(schema)
    assert content == {"greeting": "hello", "notify": True, "tags": ["b"]}
    content["tags"].append("a")  # a copy: the schema's default must not change
    assert schema["properties"]["tags"]["default"] == ["b"]


def test_defaults_of_every_shape_validate() -> None:
    schema = form(SHAPES, required=tuple(SHAPES))
    assert validate(schema, defaults(schema)) == {}


# -- purity


def test_works_without_django_settings() -> None:
    """The module must not need a configured Django: run it in a clean interpreter."""
    script = (
        "from approvals.schema_forms import check_schema, clean, defaults, fields, validate\n"
        "s = {'type': 'object', 'properties': {'n': {'type': 'integer', 'maximum': 3}}, 'required': ['n']}\n"
        "assert check_schema(s) == []\n"
        "assert fields(s)[0].hint == 'Whole number, at most 3'\n"
        "assert clean(s, {'n': ['4']}) == ({'n': 4}, {'n': 'Must be at most 3'})\n"
        "assert validate(s, defaults(s)) == {}\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "print('ok')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
