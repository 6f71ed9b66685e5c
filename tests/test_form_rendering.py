"""Forms built from requestedSchema: every shape the spec allows, rendered, then posted back to the view.

Two tables: what the browser is given for each shape (widget, attributes, defaults, required marks), and
what the server does with what a reviewer typed (the JSON value sent, or the message beside the field).
"""

from __future__ import annotations

import uuid
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string

from approvals.forms import answer_form
from approvals.models import InputRequest, Membership
from tests import factories


def schema(prop: dict[str, Any] | None = None, *, required: bool = False) -> dict[str, Any]:
    properties = {"x": prop} if prop else {}
    return {"type": "object", "properties": properties, "required": ["x"] if required and prop else []}


class Elements(HTMLParser):
    """Every element with its attributes, and the text of each label/legend/option, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.texts: dict[str, list[str]] = {"label": [], "legend": [], "option": []}
        self._open: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {name: value or "" for name, value in attrs}))  # present -> ""
        if tag in self.texts:
            self.texts[tag].append("")
            self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._open:
            tag = self._open[-1]
            self.texts[tag][-1] = " ".join((self.texts[tag][-1] + " " + data).split())

    def fields(self) -> list[dict[str, str | None]]:
        return [
            {"tag": tag, **attrs}
            for tag, attrs in self.elements
            if tag in ("input", "select", "textarea") and (attrs.get("name") or "").startswith("f-")
        ]


def render(requested: dict[str, Any], tz: str = "Europe/Paris") -> Elements:
    form = answer_form(requested, tz=tz)
    html = render_to_string(
        "approvals/_answer_form.html",
        {"form": form, "ir": SimpleNamespace(pk=uuid.uuid4()), "pending": True, "may_answer": True},
    )
    return Elements(html)


RENDERING = [
    pytest.param(
        {"type": "string", "title": "Title", "minLength": 3, "maxLength": 80, "default": "Review"},
        True,
        [
            {
                "tag": "input",
                "type": "text",
                "minlength": "3",
                "maxlength": None,  # a browser counts UTF-16 units: the page script checks
                "value": "Review",
                "required": "",
            }
        ],
        id="text-with-bounds-default-required",
    ),
    pytest.param(
        {"type": "string", "format": "email"},
        False,
        [{"tag": "input", "type": "email", "value": "", "dir": "ltr"}],
        id="email-optional",
    ),
    pytest.param({"type": "string", "format": "uri"}, False, [{"tag": "input", "type": "url"}], id="uri"),
    pytest.param(
        {"type": "string", "format": "date", "default": "2026-12-02"},
        True,
        [{"tag": "input", "type": "date", "value": "2026-12-02"}],
        id="date",
    ),
    pytest.param(
        {"type": "string", "format": "date-time", "default": "2026-12-02T09:30:00Z"},
        True,
        [{"tag": "input", "type": "datetime-local", "value": "2026-12-02T10:30"}],  # shown in Paris time
        id="date-time-default-in-the-reviewers-zone",
    ),
    pytest.param(
        {"type": "number", "minimum": 0.25, "maximum": 8, "default": 1},
        True,
        [{"tag": "input", "type": "text", "inputmode": "decimal", "value": "1"}],
        id="number-bounds",
    ),
    pytest.param(
        {"type": "integer", "minimum": 2, "maximum": 50},
        False,
        [{"tag": "input", "type": "text", "inputmode": "numeric", "value": ""}],
        id="integer-bounds",
    ),
    pytest.param(
        {"type": "integer", "minimum": -5},
        False,
        [{"tag": "input", "type": "text", "inputmode": None}],  # a minus sign needs the full keyboard
        id="integer-negative-allowed",
    ),
    pytest.param(
        {"type": "boolean", "default": True},
        False,
        [{"tag": "input", "type": "checkbox", "value": "true", "checked": ""}],
        id="boolean-default-true",
    ),
    pytest.param(
        {"type": "boolean", "default": False},
        True,
        [{"tag": "input", "type": "checkbox", "value": "true", "checked": None}],
        id="boolean-default-false",
    ),
    pytest.param(
        {"type": "string", "enum": ["a", "b"], "default": "b"},
        True,
        [
            {"tag": "input", "type": "radio", "value": "a", "checked": None},
            {"tag": "input", "type": "radio", "value": "b", "checked": ""},
        ],
        id="untitled-enum-required",
    ),
    pytest.param(
        {"type": "string", "enum": ["a", "b"]},
        False,
        [
            {"tag": "input", "type": "radio", "value": "a"},
            {"tag": "input", "type": "radio", "value": "b"},
            {"tag": "input", "type": "radio", "value": "", "checked": ""},  # "No answer"
        ],
        id="untitled-enum-optional-has-no-answer",
    ),
    pytest.param(
        {"type": "string", "oneOf": [{"const": "lo", "title": "Low"}, {"const": "hi", "title": "High"}]},
        True,
        [{"tag": "input", "type": "radio", "value": "lo"}, {"tag": "input", "type": "radio", "value": "hi"}],
        id="titled-oneOf",
    ),
    pytest.param(
        {"type": "string", "enum": ["UTC", "Europe/Paris"], "enumNames": ["UTC", "Paris"]},
        True,
        [
            {"tag": "input", "type": "radio", "value": "UTC"},
            {"tag": "input", "type": "radio", "value": "Europe/Paris"},
        ],
        id="legacy-enumNames",
    ),
    pytest.param(
        {"type": "string", "enum": [f"o{i}" for i in range(8)], "default": "o3"},
        True,
        [{"tag": "select", "required": ""}],
        id="eight-options-become-a-select",
    ),
    pytest.param(
        {
            "type": "array",
            "items": {"type": "string", "enum": ["r", "b", "h"]},
            "minItems": 1,
            "maxItems": 2,
            "default": ["r"],
        },
        True,
        [
            {"tag": "input", "type": "checkbox", "value": "r", "checked": ""},
            {"tag": "input", "type": "checkbox", "value": "b", "checked": None},
            {"tag": "input", "type": "checkbox", "value": "h", "checked": None},
        ],
        id="untitled-multi-select",
    ),
    pytest.param(
        {
            "type": "array",
            "items": {"anyOf": [{"const": "p", "title": "Projector"}, {"const": "v", "title": "Video"}]},
        },
        False,
        [
            {"tag": "input", "type": "checkbox", "value": "p"},
            {"tag": "input", "type": "checkbox", "value": "v"},
        ],
        id="titled-multi-select",
    ),
]


@pytest.mark.parametrize(("prop", "required", "expected"), RENDERING)
def test_each_schema_shape_renders_as_the_right_input(prop, required, expected) -> None:
    found = render(schema(prop, required=required)).fields()
    assert len(found) == len(expected), found
    for element, wanted in zip(found, expected, strict=True):
        assert element["name"] == "f-x"
        for attribute, value in wanted.items():
            assert element.get(attribute) == value, (attribute, element)


def test_labels_required_marks_hints_and_defaults_are_shown() -> None:
    requested = {
        "type": "object",
        "properties": {
            "title": {
                "type": "string",
                "title": "Title",
                "description": "What it is about",
                "default": "Review",
            },
            "room": {"type": "string", "enum": ["UTC", "Europe/Paris"], "enumNames": ["UTC", "Paris (CET)"]},
            "level": {"type": "string", "oneOf": [{"const": "hi", "title": "High"}], "default": "hi"},
            "count": {"type": "integer", "minimum": 2, "maximum": 50},
            "topics": {"type": "array", "items": {"anyOf": [{"const": "p", "title": "Projector"}]}},
        },
        "required": ["title"],
    }
    form = answer_form(requested, tz="UTC")
    html = render_to_string(
        "approvals/_answer_form.html",
        {"form": form, "ir": SimpleNamespace(pk=uuid.uuid4()), "pending": True, "may_answer": True},
    )
    page = Elements(html)
    assert "Title" in page.texts["label"]  # required: no mark
    assert "Count (optional)" in page.texts["label"]
    assert "Paris (CET)" in page.texts["label"]  # enumNames label, enum value
    assert "Projector" in page.texts["label"]
    assert "Room (optional)" in page.texts["legend"]
    assert "What it is about" in html
    assert "Whole number, between 2 and 50" in html
    assert 'Suggested by the server: <bdi dir="auto">High</bdi>' in html  # the title, not the const
    assert 'dir="auto">What it is about' in html


def test_a_schema_without_properties_is_a_plain_confirmation() -> None:
    html = render_to_string(
        "approvals/_answer_form.html",
        {"form": answer_form(schema(), tz="UTC"), "ir": SimpleNamespace(pk=uuid.uuid4()), "pending": True},
    )
    assert "The server asks for no values" in html
    assert Elements(html).fields() == []


# --- posting: the server checks again with the same rules -------------------------------------------------

OK = object()

POSTING = [
    # (property, required, posted values, expected JSON value or error message)
    pytest.param({"type": "integer"}, False, ["2o"], "Enter a whole number", id="integer-typo"),
    pytest.param({"type": "integer"}, True, ["1.0"], "Enter a whole number", id="required-integer-1.0"),
    pytest.param({"type": "integer"}, True, [""], "This field is required", id="required-integer-empty"),
    pytest.param({"type": "integer", "minimum": 2, "maximum": 50}, True, ["2"], 2, id="integer-at-minimum"),
    pytest.param({"type": "integer", "minimum": 2, "maximum": 50}, True, ["50"], 50, id="integer-at-maximum"),
    pytest.param({"type": "integer", "minimum": 2}, True, ["1"], "Must be at least 2", id="integer-below"),
    pytest.param({"type": "integer", "maximum": 50}, True, ["51"], "Must be at most 50", id="integer-above"),
    pytest.param({"type": "number", "minimum": 0.25}, True, ["0.25"], 0.25, id="number-at-minimum"),
    pytest.param(
        {"type": "number", "minimum": 0.25}, True, ["0.2"], "Must be at least 0.25", id="number-below"
    ),
    pytest.param(
        {"type": "number"}, True, ["1,5"], "Enter a number, using a point for decimals (1.5)", id="comma"
    ),
    pytest.param({"type": "number"}, True, ["3"], 3, id="number-whole"),
    pytest.param(
        {"type": "string", "minLength": 3}, True, ["ab"], "Enter at least 3 characters", id="too-short"
    ),
    pytest.param({"type": "string", "minLength": 3}, True, ["  abc  "], "abc", id="stripped-at-minimum"),
    pytest.param(
        {"type": "string", "maxLength": 5}, True, ["abcdef"], "Enter at most 5 characters", id="too-long"
    ),
    pytest.param({"type": "string", "maxLength": 5}, True, ["abcde"], "abcde", id="at-maximum-length"),
    pytest.param(
        {"type": "string", "format": "email"},
        True,
        ["a@"],
        "Enter an email address like name@example.com",
        id="email",
    ),
    pytest.param(
        {"type": "string", "format": "uri"},
        True,
        ["example.com"],
        "Enter a full web address like https://example.com",
        id="uri-without-scheme",
    ),
    pytest.param(
        {"type": "string", "format": "date"}, True, ["2026-02-30"], "Enter a real date", id="no-such-date"
    ),
    pytest.param(
        {"type": "string", "format": "date-time"},
        True,
        ["2026-12-02T10:30"],
        "2026-12-02T10:30:00+01:00",
        id="date-time-in-the-reviewers-zone",
    ),
    pytest.param({"type": "boolean"}, True, [], False, id="unticked-is-false"),
    pytest.param({"type": "boolean"}, True, ["true"], True, id="ticked-is-true"),
    pytest.param(
        {"type": "string", "enum": ["a", "b"]}, True, [""], "This field is required", id="enum-empty"
    ),
    pytest.param(
        {"type": "string", "enum": ["a", "b"]}, True, ["zzz"], "Choose one of the options", id="enum-wrong"
    ),
    pytest.param(
        {"type": "string", "oneOf": [{"const": "lo", "title": "Low"}]},
        True,
        ["lo"],
        "lo",
        id="titled-const-sent",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string", "enum": ["r", "b", "h", "i"]}, "minItems": 1},
        True,
        [],
        "Choose at least 1 option",
        id="multi-too-few",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string", "enum": ["r", "b", "h", "i"]}, "maxItems": 3},
        True,
        ["r", "b", "h", "i"],
        "Choose at most 3 options",
        id="multi-too-many",
    ),
    pytest.param(
        {"type": "array", "items": {"anyOf": [{"const": "p", "title": "P"}, {"const": "v", "title": "V"}]}},
        False,
        ["v", "p"],
        ["v", "p"],
        id="multi-titled",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string", "enum": ["r"]}},
        False,
        ["x"],
        "Choose only from the options",
        id="multi-wrong",
    ),
]


@pytest.fixture
def reviewer(db, client) -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    client.force_login(alice)
    return SimpleNamespace(user=alice, team=release, server=factories.server(default_team=release))


def asking(reviewer: Any, requested: dict[str, Any]) -> InputRequest:
    rnd = factories.open_round(factories.call(reviewer.server), team_=reviewer.team)
    ir = rnd.input_requests.get()
    ir.requested_schema = requested
    ir.save(update_fields=["requested_schema"])
    return ir


@pytest.mark.parametrize(("prop", "required", "posted", "expected"), POSTING)
def test_the_server_checks_what_was_typed(client, reviewer, prop, required, posted, expected) -> None:
    ir = asking(reviewer, schema(prop, required=required))
    response = client.post(
        f"/requests/{ir.pk}/respond/", {"action": "accept", "tz": "Europe/Paris", "f-x": posted}
    )
    ir.refresh_from_db()
    if isinstance(expected, str) and response.status_code == 422:
        assert ir.status == "pending"
        html = response.content.decode()
        assert f"data-field-error>{expected}</p>" in html.replace("&#x27;", "'")
        assert "There is a problem" in html
        if prop["type"] in ("string", "number", "integer") and "enum" not in prop and "oneOf" not in prop:
            assert f'value="{posted[0]}"' in html  # what the reviewer typed is still there
        return
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ir.content == {"x": expected}
    assert type(ir.content["x"]) is type(expected)


def test_a_form_with_only_optional_fields_can_be_sent_empty(client, reviewer) -> None:
    requested = {
        "type": "object",
        "properties": {
            "note": {"type": "string"},
            "count": {"type": "integer"},
            "level": {"type": "string", "enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["x"]}},
        },
    }
    ir = asking(reviewer, requested)
    response = client.post(f"/requests/{ir.pk}/respond/", {"action": "accept", "f-level": ""})
    assert response.status_code == 302
    ir.refresh_from_db()
    assert (ir.action, ir.content) == ("accept", {})


def test_a_confirmation_is_accepted_with_no_content(client, reviewer) -> None:
    ir = asking(reviewer, schema())
    assert client.post(f"/requests/{ir.pk}/respond/", {"action": "accept"}).status_code == 302
    ir.refresh_from_db()
    assert (ir.action, ir.content) == ("accept", {})


def test_a_suggested_date_time_is_an_instant_the_page_shows_on_the_readers_clock() -> None:
    """The field itself is prefilled in the reviewer's zone; its suggestion line showed the server's raw UTC
    text beside it (``...T10:00Z`` next to 11:00). An instant is given to the page as one, to be shown on the
    reader's clock as every time is (a default without an offset is refused with the schema already)."""
    requested = {
        "type": "object",
        "properties": {
            "start": {"type": "string", "format": "date-time", "default": "2026-07-01T10:00:00Z"},
            "label": {"type": "string", "default": "2026-07-01T10:00:00Z"},
        },
    }
    form = answer_form(requested, tz="Europe/Paris")
    html = render_to_string(
        "approvals/_answer_form.html",
        {"form": form, "ir": SimpleNamespace(pk=uuid.uuid4()), "pending": True, "may_answer": True},
    )
    assert '<time datetime="2026-07-01T10:00:00+00:00" data-local-time>2026-07-01T10:00:00Z</time>' in html
    assert html.count("data-local-time") == 1  # not the plain text field's
