"""Answer forms met by a hostile server, a careless API client and a confused reviewer: the answer sent on
must satisfy the schema and be what the reviewer meant, and a form nobody can fill in is refused up front.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from approvals import schema_forms


def form(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


class PostData(dict):
    """A stand-in for request.POST: name -> list of strings."""

    def getlist(self, key: str) -> list[str]:
        return list(self.get(key, []))


# -- a typed web address is sent as the address typed, not a neighbour of it


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        # What a browser's address bar (the URL standard: UTS 46, not transitional) makes of each.
        ("https://straße.de/", "https://xn--strae-oqa.de/"),
        ("https://σοφός.gr/", "https://xn--0xagbn4a.gr/"),
        ("https://a_b.bücher.example/", "https://a_b.xn--bcher-kva.example/"),
        ("https://Bücher\u3002example/", "https://xn--bcher-kva.example/"),
    ],
)
def test_an_international_domain_is_encoded_as_a_browser_does(typed: str, sent: str) -> None:
    """Python's "idna" codec is IDNA 2003: straße.de went out as strasse.de and σοφός.gr with its final
    sigma changed, other domains than the ones the reviewer typed, and the form said nothing."""
    schema = form({"page": {"type": "string", "format": "uri"}}, ("page",))

    content, errors = schema_forms.clean(schema, PostData({"f-page": [typed]}), prefix="f-")

    assert (content, errors) == ({"page": sent}, {})


def test_a_domain_with_an_invisible_joiner_is_refused_rather_than_shortened() -> None:
    """IDNA 2003 dropped the zero-width joiner, so a.\u200db.example was sent as ab.example."""
    schema = form({"page": {"type": "string", "format": "uri"}}, ("page",))

    content, errors = schema_forms.clean(
        schema, PostData({"f-page": ["https://a\u200db.example/"]}), prefix="f-"
    )

    assert errors == {"page": "Enter a full web address like https://example.com"}
    assert "ab.example" not in str(content)


# -- a date-time or web address with a line break after it is not one


@pytest.mark.parametrize(
    ("prop", "value"),
    [
        ({"type": "string", "format": "date-time"}, "2026-12-02T10:30:00Z\n"),
        ({"type": "string", "format": "uri"}, "https://example.com/\n"),
    ],
    ids=["date-time", "uri"],
)
def test_an_api_answer_with_a_trailing_line_break_is_refused(prop: dict[str, Any], value: str) -> None:
    """The format checks match with `$`, which also matches before a final line break: the answer was
    accepted and sent to a server that refuses it."""
    schema = form({"x": prop}, ("x",))

    assert schema_forms.validate(schema, {"x": value}) != {}
    assert schema_forms.validate(schema, {"x": value.rstrip("\n")}) == {}


def test_a_server_default_with_a_trailing_line_break_is_refused_up_front() -> None:
    schema = form({"when": {"type": "string", "format": "date-time", "default": "2026-12-02T10:30:00Z\n"}})

    assert schema_forms.check_schema(schema) == [
        "Field \u201cwhen\u201d: the default is not valid (Enter a date and time with a time zone, "
        "like 2026-12-02T10:30:00+01:00)"
    ]


# -- choices a form submission cannot tell apart


@pytest.mark.parametrize(
    "prop",
    [
        {
            "type": "string",
            "oneOf": [{"const": "go\nnow", "title": "Approve"}, {"const": "go\r\nnow", "title": "Stop"}],
        },
        {"type": "string", "enum": ["go\rnow", "go\nnow"]},
        {
            "type": "array",
            "items": {"anyOf": [{"const": "a\nb", "title": "A"}, {"const": "a\r\nb", "title": "B"}]},
        },
    ],
    ids=["titled", "untitled", "multi-select"],
)
def test_choices_that_differ_only_in_line_breaks_are_refused(prop: dict[str, Any]) -> None:
    """A browser posts every line break of a value as CRLF: ticking "Approve" answered "Stop"."""
    schema = form({"choice": prop}, ("choice",))

    problems = schema_forms.check_schema(schema)

    assert len(problems) == 1
    assert "differ only in their line breaks" in problems[0]
    with pytest.raises(schema_forms.UnsupportedSchema):
        schema_forms.clean(schema, PostData({"f-choice": ["go\r\nnow"]}), prefix="f-")


# -- length limits no value of the format can meet


@pytest.mark.parametrize(
    ("prop", "problem"),
    [
        ({"format": "date", "maxLength": 8}, "leave no valid date (a date has 10 characters)"),
        ({"format": "date", "minLength": 11}, "leave no valid date (a date has 10 characters)"),
        ({"format": "date-time", "maxLength": 19}, "leave no valid date and time"),
        ({"format": "date-time", "minLength": 21, "maxLength": 21}, "leave no valid date and time"),
        ({"format": "email", "maxLength": 5}, "leave no valid email address"),
        ({"format": "email", "minLength": 321}, "leave no valid email address"),
        ({"format": "uri", "maxLength": 1}, "leaves no valid web address"),
    ],
)
def test_length_limits_that_rule_out_every_value_are_refused(prop: dict[str, Any], problem: str) -> None:
    """Such a field was drawn, and whatever the reviewer typed was refused ("Enter at most 8 characters" under
    a valid date); "accept with defaults" sent an answer the server refuses."""
    schema = form({"x": {"type": "string", **prop}}, ("x",))

    (message,) = schema_forms.check_schema(schema)

    assert message.startswith("Field \u201cx\u201d: ") and problem in message


@pytest.mark.parametrize(
    "prop",
    [
        {"format": "date", "minLength": 10, "maxLength": 10},
        {"format": "date-time", "maxLength": 20},
        {"format": "date-time", "maxLength": 22},
        {"format": "date-time", "minLength": 26, "maxLength": 26},
        {"format": "date-time", "minLength": 40},
        {"format": "email", "maxLength": 6},
        {"format": "email", "minLength": 320},
        {"format": "uri", "maxLength": 2},
    ],
)
def test_tight_but_possible_length_limits_get_a_valid_default_answer(prop: dict[str, Any]) -> None:
    """defaults() (the conformance adapter's "accept") answered "…T10:30:00+00:00" under maxLength 20 and
    "a:b" under maxLength 2: answers the server refuses."""
    schema = form({"x": {"type": "string", **prop}}, ("x",))
    assert schema_forms.check_schema(schema) == []

    content = schema_forms.defaults(schema, now=datetime(2026, 12, 2, 10, 30, tzinfo=UTC))

    assert schema_forms.validate(schema, content) == {}


# -- a number too small for a float is not silently zero


@pytest.mark.parametrize("typed", ["1e-400", "-2.5e-999", "0." + "0" * 400 + "7"])
def test_a_number_too_close_to_zero_is_refused_not_sent_as_zero(typed: str) -> None:
    schema = form({"rate": {"type": "number", "minimum": 0}}, ("rate",))

    content, errors = schema_forms.clean(schema, PostData({"f-rate": [typed]}), prefix="f-")

    assert content == {}
    assert errors == {"rate": "Enter a number further from zero, or 0"}


@pytest.mark.parametrize(("typed", "sent"), [("0", 0), ("0.000", 0.0), ("0e-999", 0.0), ("5e-324", 5e-324)])
def test_zero_and_tiny_numbers_that_fit_are_still_sent(typed: str, sent: float) -> None:
    schema = form({"rate": {"type": "number"}}, ("rate",))

    content, errors = schema_forms.clean(schema, PostData({"f-rate": [typed]}), prefix="f-")

    assert (content, errors) == ({"rate": sent}, {})


# -- a whole number field states its limits as whole numbers it accepts


def test_a_whole_number_fields_limits_are_written_out_as_it_takes_them() -> None:
    """A minimum of 1e20 was shown as "at least 1e+20", and typing that got "Enter a whole number"; a maximum
    of 9.9 read "at most 9.9" where 9 is the largest answer."""
    schema = form(
        {
            "n": {"type": "integer", "minimum": 1e20, "maximum": 1.5e20},
            "m": {"type": "integer", "maximum": 9.9},
        }
    )

    hints = {field.name: field.hint for field in schema_forms.fields(schema, prefix="f-")}
    _content, errors = schema_forms.clean(schema, PostData({"f-n": ["5"], "f-m": ["10"]}), prefix="f-")

    assert hints == {
        "n": "Whole number, between 100000000000000000000 and 150000000000000000000",
        "m": "Whole number, at most 9",
    }
    assert errors == {"n": "Must be at least 100000000000000000000", "m": "Must be at most 9"}
    written = schema_forms.clean(schema, PostData({"f-n": ["100000000000000000000"]}), prefix="f-")
    assert written == ({"n": 10**20}, {})


# -- what the MCP SDKs write for ordinary pydantic models


def test_a_null_default_is_no_default() -> None:
    """FastMCP writes `"default": null` for a field declared `= None`; the whole form was refused ("the
    default is not valid") and the reviewer could only decline."""
    schema = form(
        {
            "at": {"type": "string", "format": "date-time", "title": "At", "default": None},
            "note": {"type": "string", "default": None},
            "count": {"type": "integer", "minimum": 2, "default": None},
        },
        ("count",),
    )

    assert schema_forms.check_schema(schema) == []
    assert [(field.initial, field.default) for field in schema_forms.fields(schema, prefix="f-")] == [
        ("", None),
        ("", None),
        ("", None),
    ]
    assert schema_forms.clean(schema, PostData({"f-count": ["3"]}), tz="UTC", prefix="f-") == (
        {"count": 3},
        {},
    )
    assert schema_forms.defaults(schema) == {"count": 2}  # never a null the schema does not allow


def test_a_multi_select_that_says_each_option_once_is_drawn() -> None:
    """Both Python SDKs write `"uniqueItems": true` for a `set[Literal[...]]`: the form was refused, though
    the hub never sends an option twice."""
    prop = {
        "type": "array",
        "title": "Tags",
        "items": {"type": "string", "enum": ["x", "y"]},
        "uniqueItems": True,
        "default": [],
    }
    schema = form({"tags": prop})

    assert schema_forms.check_schema(schema) == []
    assert schema_forms.clean(schema, PostData({"f-tags": ["y", "x"]}), prefix="f-") == (
        {"tags": ["y", "x"]},
        {},
    )
    assert schema_forms.validate(schema, {"tags": ["x", "x"]}) == {"tags": "Choose each option only once"}
    refused = schema_forms.check_schema(form({"tags": {**prop, "uniqueItems": "yes"}}))
    assert refused == ["Field \u201ctags\u201d: \u201cuniqueItems\u201d must be true or false"]


# -- text that is not Unicode


def test_a_choice_that_is_not_valid_text_is_refused_up_front() -> None:
    """A lone surrogate in an option passed the check: the form was drawn, and choosing that option (the only
    one of a required field, here) was refused whatever the reviewer did."""
    schema = form({"pick": {"type": "string", "enum": ["\ud800"]}}, ("pick",))

    assert schema_forms.check_schema(schema) == [
        "The form description contains characters that are not valid text"
    ]


def test_a_typed_address_that_is_not_valid_text_gets_a_message_not_a_crash() -> None:
    schema = form({"page": {"type": "string", "format": "uri"}}, ("page",))

    _content, errors = schema_forms.clean(
        schema, PostData({"f-page": ["https://example.com/\ud800"]}), prefix="f-"
    )

    assert errors == {"page": "Remove the characters that are not valid text"}


# -- a suggestion the reviewer took back


def test_suggested_text_the_reviewer_emptied_is_sent_empty_not_left_to_the_server() -> None:
    """Left out, a server that fills missing fields from its defaults read "Weekly report", the very text the
    reviewer deleted (as a multi-select's unticked suggestions already said)."""
    schema = form(
        {
            "subject": {"type": "string", "default": "Weekly report"},
            "code": {"type": "string", "default": "A1", "minLength": 1},  # "" is no valid answer: left out
            "mail": {"type": "string", "format": "email", "default": "ops@example.com"},
            "note": {"type": "string"},  # nothing suggested: left out
        }
    )
    posted = PostData({"f-subject": ["  "], "f-code": [""], "f-mail": [""], "f-note": [""]})

    content, errors = schema_forms.clean(schema, posted, prefix="f-")

    assert (content, errors) == ({"subject": ""}, {})


def test_a_typed_date_and_time_fits_a_tight_max_length_as_the_same_instant_in_utc() -> None:
    """The form wrote every date-time as "…+01:00" (25 characters): under a maxLength of 20 to 24, which
    "2026-12-02T09:30:00Z" meets, whatever the reviewer typed was refused ("Enter at most 22 characters")."""
    schema = form({"when": {"type": "string", "format": "date-time", "maxLength": 22}}, ("when",))

    assert schema_forms.clean(
        schema, PostData({"f-when": ["2026-12-02T10:30"]}), tz="Europe/Paris", prefix="f-"
    ) == (
        {"when": "2026-12-02T09:30:00Z"},
        {},
    )
    assert schema_forms.clean(
        schema, PostData({"f-when": ["2026-12-02T10:30:00.5"]}), tz="Europe/Paris", prefix="f-"
    ) == ({"when": "2026-12-02T09:30:00.5Z"}, {})
    roomy = form({"when": {"type": "string", "format": "date-time", "maxLength": 25}}, ("when",))
    assert schema_forms.clean(
        roomy, PostData({"f-when": ["2026-12-02T10:30"]}), tz="Europe/Paris", prefix="f-"
    ) == (
        {"when": "2026-12-02T10:30:00+01:00"},  # kept in the reviewer's own offset when it fits
        {},
    )


# -- thousands separators: say what to type, do not invite a wrong number


@pytest.mark.parametrize("typed", ["1,000", "12,345,678", "1,000.5", "1 000", "12.345.678", "-1,000"])
def test_a_number_with_thousands_separators_is_not_answered_with_a_decimal_point_hint(typed: str) -> None:
    """ "1,000" got "Enter a number, using a point for decimals (1.5)": a reviewer who meant a thousand was
    told to type 1.000, which is sent as 1."""
    schema = form({"amount": {"type": "number"}}, ("amount",))

    content, errors = schema_forms.clean(schema, PostData({"f-amount": [typed]}), prefix="f-")

    assert content == {}
    assert errors == {"amount": "Enter the number without thousands separators: 1000, or 1.5 for decimals"}


@pytest.mark.parametrize("typed", ["1,000", "1.000", "1 000", "1'000", "12,345,678"])
def test_a_whole_number_with_thousands_separators_says_to_leave_them_out(typed: str) -> None:
    schema = form({"count": {"type": "integer"}}, ("count",))

    _content, errors = schema_forms.clean(schema, PostData({"f-count": [typed]}), prefix="f-")

    assert errors == {"count": "Enter the whole number without separators, like 1000"}


@pytest.mark.parametrize(("kind", "typed"), [("number", "1,5"), ("number", "1.000,5"), ("integer", "1,5")])
def test_a_decimal_comma_keeps_its_own_message(kind: str, typed: str) -> None:
    schema = form({"x": {"type": kind}}, ("x",))

    _content, errors = schema_forms.clean(schema, PostData({"f-x": [typed]}), prefix="f-")

    expected = (
        "Enter a number, using a point for decimals (1.5)" if kind == "number" else "Enter a whole number"
    )
    assert errors == {"x": expected}


# -- a typed international email domain is sent in ASCII, as Chromium's email input sends it


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("ops@bücher.example", "ops@xn--bcher-kva.example"),
        ("Ops@例え.テスト", "Ops@xn--r8jz45g.xn--zckzah"),
        ("ops@straße.de", "ops@xn--strae-oqa.de"),
    ],
)
def test_a_typed_international_email_domain_is_sent_in_ascii(typed: str, sent: str) -> None:
    """A browser that posts the domain as typed (not every one converts it) had it sent in Unicode, which the
    `email` format (RFC 5321, ASCII) does not allow and a server checking strictly refuses."""
    schema = form({"email": {"type": "string", "format": "email"}}, ("email",))

    content, errors = schema_forms.clean(schema, PostData({"f-email": [typed]}), prefix="f-")

    assert (content, errors) == ({"email": sent}, {})


def test_a_suggested_international_email_left_as_typed_by_the_server_is_still_its_own() -> None:
    schema = form(
        {"email": {"type": "string", "format": "email", "default": "ops@bücher.example"}}, ("email",)
    )

    content, errors = schema_forms.clean(schema, PostData({"f-email": ["ops@bücher.example"]}), prefix="f-")

    assert (content, errors) == ({"email": "ops@bücher.example"}, {})
