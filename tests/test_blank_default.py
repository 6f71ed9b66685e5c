"""A required text field whose server suggests "" may be left blank: the form shows it as such (no
``required`` attribute, "(optional)"), and the blank answers "", the server's own value. A required field
without that default, or one whose minLength refuses "", is still required."""

from __future__ import annotations

from typing import Any

import pytest

from approvals import schema_forms
from approvals.models import InputRequest
from tests import test_forms_pages
from tests.test_forms_pages import asking, form

reviewer = test_forms_pages.reviewer  # the fixture, by its name

NOTE = {"type": "string", "title": "Release note", "default": ""}


@pytest.mark.parametrize("posted", [{"f-note": ""}, {}], ids=["blank", "absent"])
def test_a_required_field_suggested_blank_answers_blank(posted: dict[str, str]) -> None:
    schema = form({"note": NOTE}, required=("note",))
    assert schema_forms.clean(schema, {k: [v] for k, v in posted.items()}, prefix="f-") == ({"note": ""}, {})
    (field,) = schema_forms.fields(schema, prefix="f-")
    assert not field.required


@pytest.mark.parametrize(
    "prop",
    [{"type": "string"}, {"type": "string", "default": " "}],
    ids=["no-default", "blank-looking"],
)
def test_other_required_text_fields_left_blank_are_still_required(prop: dict[str, Any]) -> None:
    schema = form({"note": prop}, required=("note",))
    content, errors = schema_forms.clean(schema, {"f-note": [""]}, prefix="f-")
    assert "note" not in content
    assert errors["note"]
    (field,) = schema_forms.fields(schema, prefix="f-")
    assert field.required


def test_the_page_lets_the_reviewer_leave_it_blank_and_sends_blank(client, reviewer) -> None:
    ir = asking(reviewer, form({"note": NOTE, "ticket": {"type": "string"}}, required=("note", "ticket")))
    page = client.get(f"/requests/{ir.pk}/").content.decode()
    note = page[page.index('name="f-note"') :]
    assert "required" not in note[: note.index(">")]

    response = client.post(
        f"/requests/{ir.pk}/respond/", {"action": "accept", "f-note": "", "f-ticket": "T-1"}
    )

    assert response.status_code == 302
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.ANSWERED
    assert ir.content == {"note": "", "ticket": "T-1"}
