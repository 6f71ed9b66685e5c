"""The browser's answer form: schema_forms.Field plus what the reviewer typed and what went wrong.

schema_forms describes and cleans; this module only pairs each field with its current value (the
server's default on first display, the posted text after a failed submit) for the templates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from approvals import schema_forms
from approvals.schema_forms.coercion import as_choices

PREFIX = "f-"
TZ_FIELD = "tz"  # the reviewer's time zone (IANA name), filled in by the page


@dataclass(frozen=True)
class BoundField:
    field: schema_forms.Field
    value: str | bool | list[str]
    error: str = ""

    @property
    def chosen(self) -> list[str]:
        """The ticked or selected options of a select field."""
        if isinstance(self.value, list):
            return self.value
        return [self.value] if isinstance(self.value, str) and self.value else []

    @property
    def described_by(self) -> str:
        ids = [f"{self.field.html_id}-hint"]
        if self.error:
            ids.append(f"{self.field.html_id}-error")
        return " ".join(ids)


@dataclass(frozen=True)
class AnswerForm:
    fields: list[BoundField]
    errors: dict[str, str]
    tz: str
    confirmation: bool

    @property
    def has_datetime(self) -> bool:
        return any(bound.field.kind == "datetime" for bound in self.fields)

    @property
    def non_field_error(self) -> str:
        return self.errors.get(schema_forms.NON_FIELD, "")

    @property
    def error_list(self) -> list[BoundField]:
        return [bound for bound in self.fields if bound.error]


def answer_form(
    schema: dict[str, Any], *, tz: str, data: Any = None, errors: dict[str, str] | None = None
) -> AnswerForm:
    """The form for `schema`, prefilled with defaults, or with `data` (a POST) after a failed submit."""
    errors = errors or {}
    described = schema_forms.fields(schema, tz=tz, prefix=PREFIX)
    bound = []
    for field in described:
        value = _value(field, data)
        bound.append(BoundField(_drawn_for(field, value), value, errors.get(field.name, "")))
    return AnswerForm(bound, errors, tz, schema_forms.is_confirmation(schema))


def _drawn_for(field: schema_forms.Field, value: str | bool | list[str]) -> schema_forms.Field:
    """Text posted back with line breaks is shown in a textarea whatever the schema suggested: an <input>
    drops them (the gate page's edit starts from the asked arguments, but is drawn again from the schema)."""
    if field.kind == "text" and isinstance(value, str) and ("\n" in value or "\r" in value):
        return replace(field, widget="textarea", html_input_type="")
    return field


def _value(field: schema_forms.Field, data: Any) -> str | bool | list[str]:
    if data is None:
        return field.initial
    posted = data.getlist(field.html_name)
    if field.kind == "boolean":
        return any(value.strip().lower() in ("on", "true", "1", "yes") for value in posted)
    if field.kind in ("single_select", "multi_select"):
        # As the schema spells them (a browser posts each line break of an option's value as CRLF).
        posted = as_choices(field.choices, posted)
    if field.kind == "multi_select":
        return posted
    return posted[0] if posted else ""
