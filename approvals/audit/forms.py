"""The audit page's filters: what a user may search and filter the audit log by."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone
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


# A filter's date-time lies in this range: the analytics read 30 days before "Until", and a time is shown in
# any zone, so a date at either end of the calendar would overflow Python's datetime (a 500, not a message).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


class LocalDateTimeField(forms.DateTimeField):
    """A date-time typed on the reader's clock (the current time zone), within EARLIEST and LATEST.

    A time the clock change makes happen twice (clocks going back) or not at all (clocks going forward) is
    no error: the field takes the earliest instant it could mean (``latest=False``, for "From") or the
    latest (for "Until"), so the range holds every event shown at that time.
    """

    def __init__(self, *, latest: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.latest = latest

    def to_python(self, value: Any) -> datetime | None:
        try:
            moment = super().to_python(value)
        except ValidationError as exc:
            if exc.code != "ambiguous_timezone":
                raise
            moment = self._either_reading(value)
        if moment is not None and not EARLIEST <= moment < LATEST:
            raise ValidationError(_("Enter a date-time between 1970 and 9998."), code="out_of_range")
        return moment

    def _either_reading(self, value: Any) -> datetime | None:
        with timezone.override(UTC):
            read = super().to_python(value)
        if read is None:
            return None
        wall, zone = read.replace(tzinfo=None), timezone.get_current_timezone()
        # Compared in UTC: datetimes sharing a tzinfo compare by their wall clocks, fold ignored.
        readings = [wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)]
        return max(readings) if self.latest else min(readings)


class AuditFilterForm(forms.Form):
    q = forms.CharField(
        label=_("Search"),
        required=False,
        max_length=200,
        help_text=_(
            'Words in the event; "exact phrase", or, -word. A call or input request id finds its events '
            "and every event that mentions it."
        ),
    )
    since = LocalDateTimeField(label=_("From"), required=False, latest=False)
    until = LocalDateTimeField(label=_("Until"), required=False, latest=True)
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


class TimelineCursorForm(forms.Form):
    """Where a page of a call's timeline starts: an event id (the first page when absent)."""

    start = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
