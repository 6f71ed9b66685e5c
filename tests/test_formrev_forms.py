"""Answer forms from a server's requestedSchema, met by a hostile server, a careless API client and a
reviewer at the page: what a schema or an answer may cost the hub, and what the page keeps and says.

The tests marked with a timeout carry it as a safety net only: what they assert is the result, and the
input is large enough that the slow pass they guard against would never finish in time.
"""

from __future__ import annotations

import unicodedata
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string

from approvals import schema_forms
from approvals.forms import answer_form
from approvals.models import AuditEvent, InputRequest, Membership
from approvals.schema_forms import describe
from approvals.services import tokens
from tests import factories
from tests.hub import Reviewer


def form(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


def titled_multi_select(count: int = 200, **more: Any) -> dict[str, Any]:
    options = [{"const": f"opt{i}", "title": f"Option {i}"} for i in range(count)]
    return {"type": "array", "items": {"anyOf": options}, **more}


class PostData(dict):
    """A stand-in for request.POST: name -> list of strings."""

    def getlist(self, key: str) -> list[str]:
        return list(self.get(key, []))


def page(requested: dict[str, Any], *, data: Any = None, errors: Any = None, tz: str = "UTC") -> str:
    return render_to_string(
        "approvals/_answer_form.html",
        {
            "form": answer_form(requested, tz=tz, data=data, errors=errors),
            "ir": SimpleNamespace(pk=uuid.uuid4()),
            "pending": True,
            "may_answer": True,
        },
    )


# -- multi-selects: every item of a long list was tried against every option


@pytest.mark.timeout(30)
def test_a_server_default_listing_thousands_of_options_is_refused_at_once() -> None:
    """jsonschema tries each titled option on each item and reports every failing item: a default of 90,000
    items (inside the schema's node limit) kept the worker that took the round, and every page that drew the
    form, busy for about ten minutes."""
    schema = form({"tags": titled_multi_select(default=[f"x{i}" for i in range(90_000)])})

    assert schema_forms.check_schema(schema) == [
        "Field \u201ctags\u201d: the default is not valid (Choose only from the options)"
    ]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "items",
    [
        [f"x{i}" for i in range(100_000)],
        list(range(100_000)),
        ["opt1", *[f"opt{i % 200}" for i in range(100_000)]],
    ],
    ids=["unknown options", "numbers", "repeats"],
)
def test_an_answer_listing_thousands_of_items_is_refused_at_once(items: list[Any]) -> None:
    schema = form({"tags": titled_multi_select()})

    errors = schema_forms.validate(schema, {"tags": items})

    assert set(errors) == {"tags"}
    assert errors["tags"] in ("Choose only from the options", "Choose each option only once")


@pytest.mark.parametrize(
    ("prop", "value", "expected"),
    [
        (titled_multi_select(4, maxItems=2), ["opt0", "opt1", "opt2"], "Choose at most 2 options"),
        (titled_multi_select(4, minItems=2), ["opt3"], "Choose at least 2 options"),
        (titled_multi_select(4, maxItems=1), ["opt0", "nope"], "Choose only from the options"),
        (titled_multi_select(4), ["opt0", 1], "Choose only from the options"),
        (titled_multi_select(4), "opt0", "Must be a list of options"),
        (titled_multi_select(4), ["opt0", "opt0"], "Choose each option only once"),
        ({"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}, ["a", None], None),
        ({"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}, ["b", "a"], ""),
        (titled_multi_select(4, minItems=1, maxItems=3), ["opt3", "opt0"], ""),
    ],
)
def test_multi_select_answers_keep_their_messages(
    prop: dict[str, Any], value: Any, expected: str | None
) -> None:
    errors = schema_forms.validate(form({"tags": prop}), {"tags": value})

    if expected is None:
        assert errors == {"tags": "Choose only from the options"}
    elif expected == "":
        assert errors == {}
    else:
        assert errors == {"tags": expected}


@pytest.mark.django_db
@pytest.mark.timeout(60)
def test_an_api_answer_listing_thousands_of_items_is_a_prompt_422() -> None:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    server = factories.server("deploy", default_team=release)
    rnd = factories.open_round(factories.call(server), keys=(), team_=release)
    ir = InputRequest.objects.create(
        round=rnd,
        key="tags",
        message="Tag it",
        requested_schema=form({"tags": titled_multi_select()}),
        team=release,
    )
    _, token = tokens.personal_token_create(user=alice)

    response = Reviewer(token).respond(str(ir.pk), "accept", {"tags": [0] * 200_000})

    assert response.status_code == 422, response.content[:500]
    assert response.json()["error"]["fields"] == {"tags": "Choose only from the options"}
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.PENDING
    assert not AuditEvent.objects.filter(verb="input.answered").exists()


# -- numbers: a server's whole-number default written out is longer than 300 digits


@pytest.mark.parametrize("default", [1e305, 10**400, -(10**1000)], ids=["1e305", "10**400", "-10**1000"])
@pytest.mark.parametrize("kind", ["integer", "number"])
def test_a_huge_whole_number_default_left_as_shown_is_sent(kind: str, default: float | int) -> None:
    """An integer default is shown written out (1e305 as 305 digits); anything past 300 digits was refused
    as "Enter a whole number" (or, for a number, "Enter a smaller number"), so the form could not be approved
    with the server's own suggestion."""
    schema = form({"n": {"type": kind, "default": default}}, ("n",))
    (field,) = schema_forms.fields(schema, prefix="f-")

    content, errors = schema_forms.clean(schema, PostData({"f-n": [field.initial]}), prefix="f-")

    assert errors == {}
    assert content == {"n": default}


@pytest.mark.parametrize(
    ("typed", "message"),
    [("9" * 4301, "Enter a smaller number"), ("-" + "9" * 5000, "Enter a smaller number"), ("1.5", None)],
)
def test_a_whole_number_past_what_a_number_holds_says_so(typed: str, message: str | None) -> None:
    schema = form({"n": {"type": "integer"}})

    _content, errors = schema_forms.clean(schema, PostData({"f-n": [typed]}), prefix="f-")

    assert errors == {"n": message or "Enter a whole number"}


# -- email: a browser sends an international domain as punycode


@pytest.mark.parametrize(
    ("default", "posted"),
    [
        # What Chromium's <input type=email> submits for each value it was given.
        ("ops@bücher.example", "ops@xn--bcher-kva.example"),
        ("User@Exämple.COM", "User@xn--exmple-cua.com"),
        ("ops@straße.de", "ops@strasse.de"),
        ("ops@例え.テスト", "ops@xn--r8jz45g.xn--zckzah"),
        ("ops@\uff25\uff38\uff21\uff2d\uff30\uff2c\uff25.com", "ops@example.com"),  # full-width,
    ],
)
def test_a_suggested_international_email_left_as_shown_is_sent_as_the_server_wrote_it(
    default: str, posted: str
) -> None:
    schema = form({"email": {"type": "string", "format": "email", "default": default}}, ("email",))
    assert schema_forms.check_schema(schema) == []

    content, errors = schema_forms.clean(schema, PostData({"f-email": [posted]}), prefix="f-")

    assert errors == {}
    assert content == {"email": default}


@pytest.mark.parametrize(
    "posted",
    [
        "other@xn--bcher-kva.example",
        "OPS@xn--bcher-kva.example",
        "ops@xn--bcher-kva.org",
        "ops@bucher.example",
    ],
)
def test_a_changed_email_is_sent_as_typed(posted: str) -> None:
    schema = form({"email": {"type": "string", "format": "email", "default": "ops@bücher.example"}})

    content, errors = schema_forms.clean(schema, PostData({"f-email": [posted]}), prefix="f-")

    assert (content, errors) == ({"email": posted}, {})


# -- web addresses: a `uri` is ASCII, what a person types need not be


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("https://bücher.example/straße?q=ü#ö", "https://xn--bcher-kva.example/stra%C3%9Fe?q=%C3%BC#%C3%B6"),
        ("https://ops@Bücher.example:8443/ä", "https://ops@xn--bcher-kva.example:8443/%C3%A4"),
        ("https://[::1]:8080/ä", "https://[::1]:8080/%C3%A4"),
        ("https://example.com/plain?x=1#top", "https://example.com/plain?x=1#top"),
    ],
)
def test_a_typed_address_with_international_letters_is_sent_as_its_uri(typed: str, sent: str) -> None:
    """Chromium's <input type=url> submits such an address as typed, and the `uri` format refused it with
    "Enter a full web address like https://example.com", which it is."""
    schema = form({"page": {"type": "string", "format": "uri"}}, ("page",))

    content, errors = schema_forms.clean(schema, PostData({"f-page": [typed]}), prefix="f-")

    assert (content, errors) == ({"page": sent}, {})


@pytest.mark.parametrize("typed", ["https://exa mple.com/ä", "https://" + "ä" * 70 + ".example/"])
def test_an_address_that_is_no_uri_at_all_is_still_refused(typed: str) -> None:
    schema = form({"page": {"type": "string", "format": "uri"}}, ("page",))

    _content, errors = schema_forms.clean(schema, PostData({"f-page": [typed]}), prefix="f-")

    assert errors == {"page": "Enter a full web address like https://example.com"}


# -- a decline's reason: a browser posts each line break as CRLF


@pytest.fixture
def asked(db: Any, client: Any) -> InputRequest:
    alice = factories.user("alice")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    client.force_login(alice)
    server = factories.server("deploy", default_team=release)
    rnd = factories.open_round(factories.call(server), team_=release)
    ir = rnd.input_requests.get()
    ir.requested_schema = form({"note": {"type": "string"}})
    ir.save(update_fields=["requested_schema"])
    return ir


def test_a_reason_filling_the_box_is_kept_whole(client: Any, asked: InputRequest) -> None:
    """The box takes 2,000 characters, counting a line break once; the browser posts it as CRLF, and the
    2,000-character cut then dropped the end of the reason (here a quarter of it), from the record and from
    what goes back to the agent."""
    typed = "Wrong env\n" * 199 + "Retry it.\n"
    assert len(typed) == 2000

    response = client.post(
        f"/requests/{asked.pk}/respond/", {"action": "decline", "reason": typed.replace("\n", "\r\n")}
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    asked.refresh_from_db()
    assert (asked.action, asked.reason) == ("decline", typed)


def test_a_reason_longer_than_the_box_is_refused_and_kept_on_the_page(
    client: Any, asked: InputRequest
) -> None:
    typed = "x" * 2001

    response = client.post(f"/requests/{asked.pk}/respond/", {"action": "decline", "reason": typed})

    assert response.status_code == 400
    page_text = response.content.decode()
    assert "The reason is longer than 2000 characters" in page_text
    assert typed in page_text  # still in the box, for shortening
    asked.refresh_from_db()
    assert asked.status == InputRequest.Status.PENDING


# -- the metaschema check of a schema full of titled options


@pytest.mark.timeout(60)
def test_a_form_of_many_titled_choices_is_checked_in_moments() -> None:
    """The full JSON Schema check took most of a millisecond over each titled option: 100 fields of 200
    options (inside every limit) cost over ten seconds of the worker taking the round and of each web process
    drawing the form, again for every such schema a server varies by one word (as this one does)."""
    word = uuid.uuid4().hex
    options = [{"const": f"o{j}", "title": f"Option {j} {word}"} for j in range(200)]
    props: dict[str, Any] = {}
    for i in range(100):
        props[f"pick{i}"] = (
            {"type": "array", "items": {"anyOf": options}, "default": ["o1", "o7"]}
            if i % 2
            else {"type": "string", "oneOf": options, "default": "o3"}
        )

    assert schema_forms.check_schema(form(props)) == []


def test_the_metaschema_still_judges_a_titled_choice_schema() -> None:
    # Draft 4 wants a non-empty "required": the subset allows an empty one, the metaschema does not.
    options = [{"const": "a", "title": "A"}, {"const": "b", "title": "B"}]
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        **form({"pick": {"type": "string", "oneOf": options}}),
    }

    problems = schema_forms.check_schema(schema)

    assert len(problems) == 1
    assert problems[0].startswith("The form description is not valid JSON Schema")


# -- labels: telling choices apart must not cost a lookup per character


@pytest.mark.timeout(60)
def test_a_form_of_many_long_choice_labels_is_described_in_moments(monkeypatch) -> None:
    """Each label was read character by character in Python (three times over) to find invisible characters:
    100 fields of 200 options titled in 2,000 characters (inside every limit of the schema check) took about
    fifteen seconds on every page that drew the form; it takes about one. What is asserted is that no
    character's category is looked up in Python while the form is described (the pattern of invisible
    characters is built once per process, before)."""
    describe._format_characters()
    looked_up: list[str] = []
    category = unicodedata.category
    monkeypatch.setattr(unicodedata, "category", lambda char: looked_up.append(char) or category(char))
    word = uuid.uuid4().hex
    props = {
        f"pick{i}": titled_multi_select(200)
        | {
            "items": {
                "anyOf": [
                    {"const": f"o{j}", "title": f"Option {j} {word} caf\u00e9 " + "Lorem ipsum " * 166}
                    for j in range(200)
                ]
            }
        }
        for i in range(100)
    }

    described = schema_forms.fields(form(props))

    assert len(described) == 100
    assert all(len(field.choices) == 200 for field in described)
    assert looked_up == []


@pytest.mark.parametrize(
    ("labels", "shown"),
    [
        (["Keep", "Ke\u200bep"], ["Keep (a)", "Ke\u200bep (b)"]),  # a zero-width space aside
        (["Keep", "\uff2b\uff45\uff45\uff50"], ["Keep (a)", "\uff2b\uff45\uff45\uff50 (b)"]),  # full-width
        (["Keep", "Kee\u00adp"], ["Keep (a)", "Kee\u00adp (b)"]),  # a soft hyphen
        (["Keep", "Kéep"], ["Keep", "Kéep"]),
        (["\u200b\u2060", "Drop"], ["a", "Drop"]),  # nothing to read: the value
    ],
)
def test_labels_that_read_alike_still_show_their_values(labels: list[str], shown: list[str]) -> None:
    options = [{"const": value, "title": label} for value, label in zip("ab", labels, strict=True)]

    (field,) = schema_forms.fields(form({"pick": {"type": "string", "oneOf": options}}))

    assert [label for _value, label in field.choices] == shown


@pytest.mark.parametrize(
    ("options", "shown"),
    [
        # A title written as another option's label once that one shows its value.
        (
            [("a", "Keep (keep)"), ("keep", "Keep"), ("archive", "Keep")],
            ["Keep (keep) (a)", "Keep (keep) (keep)", "Keep (archive)"],
        ),
        # Titles written to match the values shown twice over: every label numbered by its place.
        (
            [("a", "X"), ("b", "X"), ("c", "X (a)"), ("d", "X (a) (a)")],
            ["1. X (a) (a)", "2. X (b)", "3. X (a) (c)", "4. X (a) (a)"],
        ),
    ],
)
def test_labels_a_server_wrote_to_read_alike_are_still_told_apart(
    options: list[tuple[str, str]], shown: list[str]
) -> None:
    one_of = [{"const": value, "title": label} for value, label in options]

    (field,) = schema_forms.fields(form({"pick": {"type": "string", "oneOf": one_of}}))

    labels = [label for _value, label in field.choices]
    assert len({" ".join(label.casefold().split()) for label in labels}) == len(options)
    assert labels == shown


def test_field_titles_a_server_wrote_to_read_alike_are_still_told_apart() -> None:
    props = {
        "a": {"type": "boolean", "title": "Go (b)"},
        "b": {"type": "boolean", "title": "Go"},
        "c": {"type": "boolean", "title": "Go"},
    }

    labels = [field.label for field in schema_forms.fields(form(props))]

    assert labels == ["Go (b) (a)", "Go (b) (b)", "Go (c)"]
