"""Answer forms from servers that declare an old JSON Schema version, spell a credential in look-alike
letters, or set length limits on a date and time: what is sent must satisfy the schema as the server reads
it, a credential must be warned about and kept out of the audit log, and a form must be answerable."""

from __future__ import annotations

from typing import Any

import pytest
from django.template.loader import render_to_string

from approvals import schema_forms
from approvals.audit.core import REDACTED
from approvals.forms import answer_form
from approvals.models import AuditEvent, InputRequest, Membership
from approvals.services import answers
from tests import factories


def form(props: dict[str, Any], required: tuple[str, ...] = (), **top: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), **top}


class PostData(dict):
    """A stand-in for request.POST: name -> list of strings."""

    def getlist(self, key: str) -> list[str]:
        return list(self.get(key, []))


# -- titled choices under a JSON Schema version that has no `const`

DRAFT_3 = "http://json-schema.org/draft-03/schema#"
DRAFT_4 = "http://json-schema.org/draft-04/schema#"
TITLED = {"type": "string", "oneOf": [{"const": "keep", "title": "Keep"}, {"const": "drop", "title": "Drop"}]}
TITLED_MANY = {
    "type": "array",
    "items": {"anyOf": [{"const": "a", "title": "A"}, {"const": "b", "title": "B"}]},
}


@pytest.mark.parametrize("draft", [DRAFT_3, DRAFT_4])
@pytest.mark.parametrize("prop", [TITLED, {**TITLED, "oneOf": TITLED["oneOf"][:1]}, TITLED_MANY])
def test_titled_choices_under_a_version_without_const_are_refused(draft: str, prop: dict[str, Any]) -> None:
    """Draft 4 reads {"const": "keep"} as a schema any value matches: with one option any text was accepted
    (a forged post sent "anything" on), with two every answer was refused, the offered options included."""
    schema = {"$schema": draft, "type": "object", "properties": {"choice": prop}}

    problems = schema_forms.check_schema(schema)

    assert problems == [
        "Field \u201cchoice\u201d: titled choices need JSON Schema draft 6 or later, "
        'and "$schema" declares an older one'
    ]
    assert schema_forms.validate(schema, {"choice": "anything"})


@pytest.mark.parametrize("draft", [DRAFT_4, "http://json-schema.org/draft-06/schema#", None])
def test_plain_choices_and_later_versions_still_make_a_form(draft: str | None) -> None:
    props: dict[str, Any] = {"size": {"type": "string", "enum": ["s", "m"]}}
    if draft != DRAFT_4:
        props["choice"] = TITLED
    schema = form(props, ("size",), **({"$schema": draft} if draft else {}))

    assert schema_forms.check_schema(schema) == []
    content, errors = schema_forms.clean(
        schema, PostData({"f-size": ["m"], "f-choice": ["drop"]}), prefix="f-"
    )
    assert errors == {}
    assert content == ({"size": "m", "choice": "drop"} if "choice" in props else {"size": "m"})


# -- a credential asked for in letters that read as plain ones


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44", {"type": "string"}),  # fullwidth "password"
        (
            "login",
            {
                "type": "string",
                "title": "\U0001d40f\U0001d41a\U0001d42c\U0001d42c\U0001d430\U0001d428\U0001d42b\U0001d41d",
            },
        ),
        ("code", {"type": "string", "title": "Your \uff30\uff29\uff2e"}),  # fullwidth "PIN"
        ("key", {"type": "string", "description": "Paste your API \uff4b\uff45\uff59 here"}),
        ("smtp_\uff50\uff41\uff53\uff53", {"type": "string"}),
    ],
)
def test_a_credential_spelled_in_compatibility_letters_is_still_one(name: str, prop: dict[str, Any]) -> None:
    """ "\uff30\uff41\uff53\uff53\uff57\uff4f\uff52\uff44" and its mathematical bold twin read as
    "Password" on the page, but passed for an ordinary field: no warning, and the typed secret kept in the
    audit log and shown with the answer."""
    schema = form({"name": {"type": "string"}, name: prop})

    assert schema_forms.sensitive_fields(schema) == [name]
    assert [each.sensitive for each in schema_forms.fields(schema)] == [False, True]


@pytest.mark.django_db
def test_an_answer_to_a_fullwidth_password_field_is_audited_redacted() -> None:
    alice = factories.user("alice")
    deploy = factories.server("deploy")
    team = factories.team("release", (alice, Membership.Role.REVIEWER))
    rnd = factories.open_round(factories.call(deploy), keys=(), team_=team)
    secret_key = "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44"
    schema = form({"user": {"type": "string"}, secret_key: {"type": "string"}}, ("user", secret_key))
    ir = InputRequest.objects.create(
        round=rnd, key="login", message="Sign in", requested_schema=schema, team=team
    )

    answers.input_respond(
        input_request_id=ir.pk, user=alice, action="accept", content={"user": "alice", secret_key: "hunter2"}
    )

    event = AuditEvent.objects.get(verb="input.answered")
    assert "hunter2" not in str(event.data)
    assert REDACTED in str(event.data)


# -- a date and time picked in the calendar fits the field's length limits


@pytest.mark.parametrize(
    ("limits", "sent"),
    [
        ({"minLength": 26}, "2026-12-02T10:30:00.0+01:00"),
        ({"minLength": 24, "maxLength": 24}, "2026-12-02T09:30:00.000Z"),
        ({"minLength": 22, "maxLength": 23}, "2026-12-02T09:30:00.0Z"),
        ({"maxLength": 20}, "2026-12-02T09:30:00Z"),
        ({"minLength": 20}, "2026-12-02T10:30:00+01:00"),
    ],
)
def test_a_picked_date_and_time_is_written_to_fit_a_minimum_length(limits: dict[str, int], sent: str) -> None:
    """The picker sends 10:30 and the hub writes "…10:30:00+01:00" (25 characters): a field with a minLength
    of 26 said "Enter at least 26 characters" of it, and the reviewer had no way to pick a longer one."""
    schema = form({"when": {"type": "string", "format": "date-time", **limits}}, ("when",))

    content, errors = schema_forms.clean(
        schema, PostData({"f-when": ["2026-12-02T10:30"]}), tz="Europe/Paris", prefix="f-"
    )

    assert (content, errors) == ({"when": sent}, {})


def test_a_date_and_time_field_leaves_its_length_limits_to_the_hub() -> None:
    """The page checked minLength against the picker's own text ("2026-12-02T10:30", 16 characters) and
    refused every date and time before sending; the hint counted characters nobody types."""
    schema = form({"when": {"type": "string", "format": "date-time", "minLength": 21, "maxLength": 30}})
    (bound,) = answer_form(schema, tz="Europe/Paris").fields

    page = render_to_string("approvals/_form_field.html", {"bound": bound})

    assert (bound.field.min_length, bound.field.max_length) == (None, None)
    assert "character" not in bound.field.hint
    assert "data-min-length" not in page and "minlength" not in page and "data-max-length" not in page
    content, errors = schema_forms.clean(
        schema, PostData({"f-when": ["2026-12-02T10:30"]}), tz="Europe/Paris", prefix="f-"
    )
    assert (content, errors) == ({"when": "2026-12-02T10:30:00+01:00"}, {})
