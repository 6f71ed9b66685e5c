"""Answer forms from a server's requestedSchema, as a reviewer, a hostile server and the page's browser
meet them: what the browser is given must carry the server's values unchanged, and every choice must be one
a person can tell apart from the others."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from html import unescape
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string

from approvals.forms import answer_form
from approvals.models import Membership
from approvals.schema_forms import clean, fields
from tests import factories


def form(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


def page(requested: dict[str, Any], *, data: Any = None, tz: str = "Europe/Paris") -> str:
    return render_to_string(
        "approvals/_answer_form.html",
        {
            "form": answer_form(requested, tz=tz, data=data),
            "ir": SimpleNamespace(pk=uuid.uuid4()),
            "pending": True,
            "may_answer": True,
        },
    )


def browser_posts(text: str) -> str:
    """A textarea's value as a browser submits it: every line break as CRLF."""
    return re.sub(r"\r\n|\r|\n", "\r\n", text)


def textarea_value(html: str, name: str) -> str:
    """What a browser's textarea named `name` holds: its text, less one line break right after the tag (the
    HTML parser drops it)."""
    found = re.search(rf'<textarea[^>]*\bname="{re.escape(name)}"[^>]*>(.*?)</textarea>', html, re.S)
    assert found, f"no textarea named {name}"
    text = unescape(found.group(1))
    return text[1:] if text.startswith("\n") else text


# -- multi-line text: an <input> drops every line break of its value (HTML's value sanitization)


MULTI_LINE = "Fix the login bug\n\nThe session cookie was read twice.\nCloses #12\n"


def test_a_multi_line_default_is_offered_in_a_textarea_that_holds_it_exactly() -> None:
    """A server suggesting a commit message (or a gate's asked script argument) had it shown in a one-line
    <input>: the browser strips the line breaks from an input's value, so approving it unchanged sent
    "Fix the login bugThe session cookie was read twice.Closes #12"."""
    requested = form({"message": {"type": "string", "default": MULTI_LINE}}, ("message",))
    html = page(requested)
    assert not re.search(r'<input[^>]*name="f-message"', html)
    assert textarea_value(html, "f-message") == MULTI_LINE
    # A default that starts with a line break keeps it too.
    assert (
        textarea_value(page(form({"m": {"type": "string", "default": "\nindented"}})), "f-m") == "\nindented"
    )


def test_a_multi_line_default_left_as_it_was_is_sent_as_the_server_wrote_it() -> None:
    requested = form({"message": {"type": "string", "default": MULTI_LINE}}, ("message",))
    content, errors = clean(requested, {"f-message": [browser_posts(MULTI_LINE)]}, prefix="f-")
    assert (content, errors) == ({"message": MULTI_LINE}, {})


def test_typed_multi_line_text_is_still_tidied() -> None:
    requested = form({"message": {"type": "string", "default": MULTI_LINE}}, ("message",))
    content, errors = clean(requested, {"f-message": ["  first\r\nsecond \r\n"]}, prefix="f-")
    assert (content, errors) == ({"message": "first\nsecond"}, {})


def test_a_refused_answer_shows_the_typed_lines_again() -> None:
    requested = form({"message": {"type": "string", "default": "a\nb", "maxLength": 5}}, ("message",))
    posted = {"f-message": ["one\r\ntwo\r\nthree"]}
    _content, errors = clean(requested, posted, prefix="f-")
    assert errors == {"message": "Enter at most 5 characters"}
    data = SimpleNamespace(getlist=lambda key: posted.get(key, []))
    assert textarea_value(page(requested, data=data), "f-message").replace("\r\n", "\n") == "one\ntwo\nthree"


def test_one_line_text_stays_an_input() -> None:
    (field,) = fields(form({"t": {"type": "string", "default": "one line"}}))
    assert field.widget == "input"


# -- choices a reviewer cannot tell apart


def test_choices_with_the_same_label_show_their_values() -> None:
    """Two options titled "Keep": one keeps the data, the other deletes it, and the page showed two identical
    radios. Labels that read the same (case, spacing and invisible characters aside) now name their values."""
    requested = form(
        {
            "what": {
                "type": "string",
                "oneOf": [
                    {"const": "keep", "title": "Keep"},
                    {"const": "delete_all", "title": "keep\u200b "},
                    {"const": "archive", "title": "Archive"},
                ],
            }
        }
    )
    (field,) = fields(requested)
    labels = [label for _value, label in field.choices]
    assert labels[2] == "Archive"
    assert "keep" in labels[0] and "delete_all" in labels[1]
    assert len({" ".join(label.casefold().replace("\u200b", "").split()) for label in labels}) == 3


@pytest.mark.parametrize(
    "prop",
    [
        {"type": "string", "enum": ["drop", "keep"], "enumNames": ["", "Keep"]},
        {"type": "string", "oneOf": [{"const": "drop", "title": "  "}, {"const": "keep", "title": "Keep"}]},
        {"type": "array", "items": {"anyOf": [{"const": "drop", "title": "\u200b"}, {"const": "keep"}]}},
    ],
    ids=["enumNames", "oneOf", "anyOf"],
)
def test_a_blank_choice_label_shows_the_value(prop: dict[str, Any]) -> None:
    (field,) = fields(form({"c": prop}))
    assert dict(field.choices)["drop"] == "drop"


def test_the_suggested_choice_names_the_one_the_server_means() -> None:
    requested = form(
        {
            "what": {
                "type": "string",
                "oneOf": [{"const": "keep", "title": "Keep"}, {"const": "delete_all", "title": "Keep"}],
                "default": "delete_all",
            }
        }
    )
    suggestion = re.search(r'<span class="suggested">(.*?)</span>', page(requested), re.S)
    assert suggestion and "delete_all" in suggestion.group(1)


# -- the view, end to end


@pytest.fixture
def reviewer(db, client) -> Any:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    client.force_login(alice)
    return SimpleNamespace(user=alice, team=release, server=factories.server(default_team=release))


def asking(reviewer: Any, requested: dict[str, Any]) -> Any:
    rnd = factories.open_round(factories.call(reviewer.server), team_=reviewer.team)
    ir = rnd.input_requests.get()
    ir.requested_schema = requested
    ir.save(update_fields=["requested_schema"])
    return ir


def test_a_reviewer_approving_a_multi_line_suggestion_sends_it_whole(client, reviewer) -> None:
    ir = asking(reviewer, form({"message": {"type": "string", "default": MULTI_LINE}}, ("message",)))
    shown = textarea_value(client.get(f"/requests/{ir.pk}/").content.decode(), "f-message")
    response = client.post(
        f"/requests/{ir.pk}/respond/", {"action": "accept", "tz": "UTC", "f-message": browser_posts(shown)}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    ir.refresh_from_db()
    assert ir.content == {"message": MULTI_LINE}


# -- date-times: the hub's own conversions must give back the server's instant, in valid RFC 3339


@pytest.mark.parametrize(
    ("default", "zone"),
    [
        # 02:30 on the night Paris's clocks go back happens twice: first in summer time, then in winter time.
        ("2026-10-25T00:30:00Z", "Europe/Paris"),
        ("2026-10-25T01:30:00Z", "Europe/Paris"),
        ("2026-03-08T06:30:00Z", "America/New_York"),  # 01:30 EST, the hour before a gap: an ordinary time
        # Past the calendar's edge in the reviewer's zone, the field keeps the value's own clock.
        ("0001-01-01T00:00:00Z", "America/New_York"),
    ],
)
def test_a_suggested_date_time_left_as_shown_is_sent_as_the_server_gave_it(default: str, zone: str) -> None:
    """The field shows a suggested instant on the reviewer's clock. On the night the clocks go back, that wall
    time happens twice, and sending it unchanged was refused ("happens twice ... add the UTC offset", which a
    datetime-local input cannot take); at the calendar's edge the shown time was re-read in the reviewer's
    zone and came back as a different, invalid value."""
    requested = form({"when": {"type": "string", "format": "date-time", "default": default}}, ("when",))
    (field,) = fields(requested, tz=zone, prefix="f-")
    content, errors = clean(requested, {"f-when": [str(field.initial)]}, tz=zone, prefix="f-")
    assert (content, errors) == ({"when": default}, {})


def test_a_changed_suggested_date_time_is_read_in_the_chosen_zone() -> None:
    requested = form({"when": {"type": "string", "format": "date-time", "default": "2026-12-02T09:30:00Z"}})
    content, errors = clean(requested, {"f-when": ["2026-12-02T11:00"]}, tz="Europe/Paris", prefix="f-")
    assert (content, errors) == ({"when": "2026-12-02T11:00:00+01:00"}, {})


@pytest.mark.parametrize(
    ("typed", "zone", "instant"),
    [
        ("1890-01-01T10:00", "Europe/Paris", "1890-01-01T09:50:39"),  # Paris mean time, +00:09:21
        ("1900-06-01T12:00", "Europe/Amsterdam", "1900-06-01T11:40:28"),  # Amsterdam time, +00:19:32
    ],
)
def test_a_time_in_a_zone_whose_offset_had_seconds_is_sent_as_valid_rfc3339(
    typed: str, zone: str, instant: str
) -> None:
    """Before 1911 Paris kept its own mean time (UTC+00:09:21): the hub wrote "+00:09:21" itself, RFC 3339 has
    no seconds in an offset, and the reviewer was told to "Enter a date and time with a time zone"."""
    requested = form({"when": {"type": "string", "format": "date-time"}})
    content, errors = clean(requested, {"f-when": [typed]}, tz=zone, prefix="f-")
    assert errors == {}
    sent = content["when"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", sent), sent
    assert datetime.fromisoformat(sent) == datetime.fromisoformat(instant).replace(tzinfo=UTC)


def test_a_time_before_the_calendars_first_utc_day_is_refused_with_a_message() -> None:
    requested = form({"when": {"type": "string", "format": "date-time"}})
    content, errors = clean(requested, {"f-when": ["0001-01-01T00:00"]}, tz="Asia/Tokyo", prefix="f-")
    assert (content, errors) == ({}, {"when": "Enter a real date and time"})


# -- a suggestion the reviewer took back


def test_unticking_every_suggested_option_answers_none_rather_than_leaving_the_suggestion() -> None:
    """An optional multi-select prefilled with the server's suggestion: the reviewer unticks all of it. The
    field was left out of the answer, and a server that fills missing fields from its defaults (a pydantic
    model behind FastMCP's elicit does) read the very options the reviewer took back. A checkbox group, like a
    checkbox, has no "not answered" state: it answers []."""
    notify = {
        "type": "array",
        "items": {"type": "string", "enum": ["email", "sms", "pager"]},
        "default": ["email", "pager"],
    }
    content, errors = clean(form({"notify": notify}), {}, prefix="f-")
    assert (content, errors) == ({"notify": []}, {})
    # With a minimum to meet, none is not an answer the schema allows: the field is still left out.
    content, errors = clean(form({"notify": {**notify, "minItems": 1}}), {}, prefix="f-")
    assert (content, errors) == ({}, {})
    # Without a suggestion, nothing ticked stays nothing said.
    content, errors = clean(
        form({"notify": {k: v for k, v in notify.items() if k != "default"}}), {}, prefix="f-"
    )
    assert (content, errors) == ({}, {})


def test_lines_posted_back_are_shown_in_a_textarea_even_where_the_form_had_none() -> None:
    """The gate page offers the asked arguments as the starting values (a multi-line script in a textarea),
    but draws a refused edit again from the tool's own schema, which suggests nothing: the lines came back in
    an <input>, which drops them, and sending again sent the script as one line."""
    requested = form({"script": {"type": "string"}, "count": {"type": "integer"}}, ("script", "count"))
    posted = {"f-script": ["set -e\r\nrm -rf /tmp/build\r\nmake"], "f-count": ["many"]}
    data = SimpleNamespace(getlist=lambda key: posted.get(key, []))
    html = page(requested, data=data)
    assert textarea_value(html, "f-script").replace("\r\n", "\n") == "set -e\nrm -rf /tmp/build\nmake"


# -- options whose values hold a line break: a browser sends each as CRLF


@pytest.mark.parametrize(
    ("prop", "posted", "expected"),
    [
        (
            {"type": "string", "enum": ["Dear team,\nship it", "Hold"]},
            ["Dear team,\r\nship it"],
            "Dear team,\nship it",
        ),
        (
            {"type": "string", "oneOf": [{"const": "a\rb", "title": "A"}, {"const": "c", "title": "C"}]},
            ["a\r\nb"],
            "a\rb",
        ),
        (
            {"type": "array", "items": {"type": "string", "enum": ["x\ny", "z"]}},
            ["z", "x\r\ny"],
            ["z", "x\ny"],
        ),
    ],
    ids=["enum", "oneOf", "multi"],
)
def test_an_option_with_a_line_break_can_be_chosen(
    prop: dict[str, Any], posted: list[str], expected: Any
) -> None:
    """A form submission turns every line break of a value into CRLF, so the option came back spelled
    differently from the schema and was refused ("Choose one of the options"): it could never be chosen."""
    requested = form({"c": prop}, ("c",))
    assert clean(requested, {"f-c": posted}, prefix="f-") == ({"c": expected}, {})
    data = SimpleNamespace(getlist=lambda key: posted if key == "f-c" else [])
    html = page(requested, data=data)
    chosen = re.findall(r'<input type="(?:radio|checkbox)"[^>]*value="([^"]*)"[^>]*checked', html)
    assert sorted(unescape(value) for value in chosen) == sorted(
        expected if isinstance(expected, list) else [expected]
    )


def test_a_suggested_date_time_with_fractions_of_a_second_is_prefilled_where_a_browser_keeps_it() -> None:
    """A datetime-local input takes at most three digits of a second and empties itself on more: the hub wrote
    "2026-12-02T10:30:15.250000", the field showed nothing, and a required one said "This field is required"
    to a reviewer who had changed nothing."""
    default = "2026-12-02T09:30:15.25Z"
    requested = form({"when": {"type": "string", "format": "date-time", "default": default}}, ("when",))
    (field,) = fields(requested, tz="Europe/Paris", prefix="f-")
    shown = str(field.initial)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,3})?)?", shown), shown
    # As a browser posts it back (the shortest spelling of the same time), it is the server's instant.
    posted = shown.rstrip("0")
    assert clean(requested, {"f-when": [posted]}, tz="Europe/Paris", prefix="f-") == ({"when": default}, {})


def test_fields_with_the_same_label_show_their_keys() -> None:
    """Two checkboxes both titled "Dry run", one of them the key `delete_everything`: the reviewer could not
    tell which box did what. Labels that read alike name their fields' keys."""
    requested = form(
        {
            "dry_run": {"type": "boolean", "title": "Dry run"},
            "delete_everything": {"type": "boolean", "title": "dry  run"},
            "note": {"type": "string"},
        }
    )
    labels = [field.label for field in fields(requested)]
    assert "dry_run" in labels[0] and "delete_everything" in labels[1]
    assert labels[2] == "Note"
    # Keys that read alike once made into labels are told apart the same way.
    assert [
        field.label for field in fields(form({"user_id": {"type": "string"}, "userId": {"type": "string"}}))
    ] == [
        "User ID (user_id)",
        "User ID (userId)",
    ]
