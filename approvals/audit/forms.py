"""The audit page's filters: what a user may search and filter the audit log by."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from approvals.audit.verbs import NOUNS, VERBS
from approvals.models import AuditEvent, InputRequest

OUTCOMES = [
    "completed",
    "failed",
    "expired",
    "cancelled",
    "answered",
    "abandoned",
    "unsupported",
    "discarded",
]


class AuditFilterForm(forms.Form):
    q = forms.CharField(
        label=_("Search"),
        required=False,
        max_length=200,
        help_text=_(
            'Words in the event; "exact phrase", or, -word. A call or input request id finds its events.'
        ),
    )
    since = forms.DateTimeField(label=_("From"), required=False)
    until = forms.DateTimeField(label=_("Until"), required=False)
    actor = forms.CharField(label=_("Actor"), required=False, max_length=200)
    actor_type = forms.ChoiceField(
        label=_("Actor type"), required=False, choices=[("", _("Any")), *AuditEvent.ActorType.choices]
    )
    team = forms.SlugField(label=_("Team"), required=False, max_length=50)
    server = forms.CharField(label=_("Server"), required=False, max_length=50)
    tool = forms.CharField(label=_("Tool"), required=False, max_length=200)
    verb = forms.ChoiceField(
        label=_("Event"),
        required=False,
        choices=[
            ("", _("Any")),
            (_("All of a kind"), [(f"{noun}.*", f"{noun}.*") for noun in NOUNS]),
            (_("One event"), [(verb, verb) for verb in VERBS]),
        ],
    )
    action = forms.ChoiceField(
        label=_("Reviewer's action"), required=False, choices=[("", _("Any")), *InputRequest.Action.choices]
    )
    outcome = forms.ChoiceField(
        label=_("Outcome"), required=False, choices=[("", _("Any"))] + [(o, o.title()) for o in OUTCOMES]
    )
    call = forms.UUIDField(label=_("Call id"), required=False)
    input_request = forms.UUIDField(label=_("Input request id"), required=False)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since >= until:
            raise forms.ValidationError(_("“From” must be earlier than “Until”."))
        return cleaned

    def active(self) -> dict[str, Any]:
        """The filters in use, as plain JSON values (recorded with an export)."""
        return {
            name: (value.isoformat() if hasattr(value, "isoformat") else str(value))
            for name, value in self.cleaned_data.items()
            if value not in (None, "")
        }


class CursorForm(forms.Form):
    before = forms.IntegerField(required=False, min_value=1)
    after = forms.IntegerField(required=False, min_value=0)
