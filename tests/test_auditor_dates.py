"""An auditor's time range: read in the auditor's own zone, through clock changes, never a server error."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.audit import core as audit
from approvals.audit.core import Actor
from approvals.audit.forms import AuditFilterForm
from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db

EVENT_ID = re.compile(r'data-event-id="(\d+)"')
NEW_YORK = ZoneInfo("America/New_York")


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


@pytest.fixture
def event() -> AuditEvent:
    return audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"n": 1})


@pytest.mark.parametrize(
    "params",
    [
        {"until": "0001-01-05T00:00"},
        {"since": "0001-01-01T00:00+05:00"},
        {"until": "9999-12-31T23:59-05:00"},
        {"since": "9999-12-30T23:59-05:00", "until": "9999-12-31T23:59-05:00"},
    ],
)
def test_dates_at_the_ends_of_the_calendar_get_a_readable_message(
    root: Client, event: AuditEvent, params: dict[str, str]
) -> None:
    page = root.get(reverse("audit:index"), params)
    assert page.status_code == 400
    assert "There is a problem with the filters" in page.content.decode()
    assert "between 1970 and 9998" in page.content.decode()
    assert root.get(reverse("audit:newer"), params).status_code == 400
    export = root.get(reverse("audit:export", args=["csv"]), params)
    assert export.status_code == 400 and "between 1970 and 9998" in export.content.decode()
    assert not AuditEvent.objects.filter(verb="audit.exported").exists()


def local_minute(moment: datetime, zone: ZoneInfo) -> str:
    return moment.astimezone(zone).strftime("%Y-%m-%dT%H:%M")


def test_the_range_is_read_and_shown_in_the_auditors_own_zone(root: Client, event: AuditEvent) -> None:
    """The dashboard's pages show times in the browser's zone (its ``tz`` cookie): the audit page's "From"
    and "Until" mean the same clock, and its rows show it, or an auditor in New York misses by five hours."""
    root.cookies["tz"] = "America/New_York"
    window = {
        "since": local_minute(event.at - timedelta(minutes=2), NEW_YORK),
        "until": local_minute(event.at + timedelta(minutes=2), NEW_YORK),
    }
    page = root.get(reverse("audit:index"), window)
    assert page.status_code == 200
    body = page.content.decode()
    assert [int(i) for i in EVENT_ID.findall(body)] == [event.id]
    assert event.at.astimezone(NEW_YORK).strftime("%Y-%m-%d %H:%M:%S") in body
    assert "America/New_York" in body  # the page says which clock its times are on
    newer = root.get(reverse("audit:newer"), {**window, "after": event.id - 1})
    assert [int(i) for i in EVENT_ID.findall(newer.content.decode())] == [event.id]
    export = root.get(reverse("audit:export", args=["jsonl"]), window)
    lines = b"".join(export.streaming_content).decode().splitlines()
    assert sum('"type":"event"' in line for line in lines) == 1
    recorded = AuditEvent.objects.get(verb="audit.exported").data["filters"]
    expected = datetime.fromisoformat(window["since"]).replace(tzinfo=NEW_YORK)
    assert datetime.fromisoformat(recorded["since"]) == expected  # with its offset: the instant is kept


def test_an_unknown_zone_in_the_cookie_falls_back_to_the_hubs(root: Client, event: AuditEvent) -> None:
    root.cookies["tz"] = "../../etc/passwd"
    window = {
        "since": local_minute(event.at - timedelta(minutes=2), UTC),
        "until": local_minute(event.at + timedelta(minutes=2), UTC),
    }
    assert [int(i) for i in EVENT_ID.findall(root.get(reverse("audit:index"), window).content.decode())] == [
        event.id
    ]


@pytest.mark.parametrize(
    ("since", "until", "earliest", "latest"),
    [
        # Clocks go back at 03:00 CEST: 02:30 happens twice; the range holds both.
        ("2026-10-25T02:30", "2026-10-25T02:45", "2026-10-25T00:30+00:00", "2026-10-25T01:45+00:00"),
        # Clocks go forward at 02:00 CET: 02:30 never happens; the range holds every instant it could mean.
        ("2026-03-29T02:30", "2026-03-29T02:45", "2026-03-29T00:30+00:00", "2026-03-29T01:45+00:00"),
    ],
)
def test_a_time_the_clock_change_makes_ambiguous_or_skips_is_not_an_error(
    since: str, until: str, earliest: str, latest: str
) -> None:
    with timezone.override(ZoneInfo("Europe/Berlin")):
        form = AuditFilterForm({"since": since, "until": until})
        assert form.is_valid(), form.errors
    assert form.cleaned_data["since"] == datetime.fromisoformat(earliest)
    assert form.cleaned_data["until"] == datetime.fromisoformat(latest)


def test_a_range_inside_the_repeated_hour_finds_its_events_on_the_page(root: Client) -> None:
    root.cookies["tz"] = "Europe/Berlin"
    page = root.get(reverse("audit:index"), {"since": "2026-10-25T02:30", "until": "2026-10-25T02:45"})
    assert page.status_code == 200, page.content.decode()[:2000]
