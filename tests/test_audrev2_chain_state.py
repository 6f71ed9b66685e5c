"""The chain's state as the audit page shows it: a break the daily whole-chain walk found stays reported until
a whole walk passes again, times on the reader's clock, and a check that has not run for too long is said."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.urls import reverse

from approvals.audit import core as audit
from approvals.audit import tasks as audit_tasks
from approvals.audit.core import Actor
from approvals.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_state() -> None:
    cache.delete(audit.CHAIN_STATE_KEY)


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(factories.user("root", is_superuser=True, is_staff=True))
    return client


def make(n: int) -> list[AuditEvent]:
    return [
        audit.record(actor=Actor.system(), verb="server.tools_refreshed", data={"n": i}) for i in range(n)
    ]


def rewrite(event_id: int) -> None:
    """What the table's owner can always do: switch the triggers off around an UPDATE."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute("""UPDATE approvals_auditevent SET data = '{"n": 99}' WHERE id = %s""", [event_id])
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")


def chain_section(body: str) -> str:
    match = re.search(r'<section class="chain-state".*?</section>', body, re.S)
    assert match, body[:3000]
    return match.group(0)


def test_a_break_the_whole_walk_found_is_still_shown_after_the_next_hourly_check(
    root: Client, caplog: pytest.LogCaptureFixture
) -> None:
    events = make(4)
    assert audit_tasks.verify_chain(full=True)["ok"]
    rewrite(events[1].id)
    found = audit_tasks.verify_chain(full=True)
    assert not found["ok"] and found["first_bad_id"] == events[1].id
    make(2)
    caplog.clear()

    hourly = audit_tasks.verify_chain()  # walks only what came after the recorded head: it sees no break

    assert not hourly["ok"] and hourly["first_bad_id"] == events[1].id
    assert f"audit chain broken at event #{events[1].id}" in caplog.text  # what alerting watches, hourly
    section = chain_section(root.get(reverse("audit:index")).content.decode())
    assert 'data-chain-state="broken"' in section
    assert f"Chain broken at event #{events[1].id}" in section
    assert "Chain intact" not in section
    # The auditor is taken to the event named.
    assert f'href="{reverse("audit:index")}?q=%23{events[1].id}"' in section


def test_the_break_is_cleared_only_by_a_whole_walk_that_passes(root: Client) -> None:
    events = make(3)
    audit_tasks.verify_chain(full=True)
    rewrite(events[0].id)
    audit_tasks.verify_chain(full=True)
    assert not audit_tasks.verify_chain()["ok"]
    assert not audit_tasks.verify_chain()["ok"]  # however many hourly checks pass over the newer events

    # The row is put back as it was (from a backup): the next whole walk passes and the page says so.
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_auditevent DISABLE TRIGGER USER")
        cursor.execute("""UPDATE approvals_auditevent SET data = '{"n": 0}' WHERE id = %s""", [events[0].id])
        cursor.execute("ALTER TABLE approvals_auditevent ENABLE TRIGGER USER")
    assert audit_tasks.verify_chain(full=True)["ok"]
    assert audit_tasks.verify_chain()["ok"]
    assert 'data-chain-state="ok"' in root.get(reverse("audit:index")).content.decode()


def test_the_checks_times_are_on_the_readers_clock(root: Client) -> None:
    make(2)
    audit_tasks.verify_chain(full=True)
    checked = datetime.fromisoformat(audit.last_chain_state()["checked_at"])  # type: ignore[index]
    root.cookies["tz"] = "Asia/Tokyo"
    section = chain_section(root.get(reverse("audit:index")).content.decode())
    tokyo = checked.astimezone(ZoneInfo("Asia/Tokyo"))
    assert tokyo.strftime("%Y-%m-%d %H:%M:%S") in section
    assert checked.isoformat() not in section  # not the stored UTC text


def test_a_check_that_has_not_run_for_hours_is_called_out(root: Client) -> None:
    make(2)
    state = audit_tasks.verify_chain(full=True)
    cache.set(
        audit.CHAIN_STATE_KEY,
        {**state, "checked_at": (datetime.now(UTC) - timedelta(hours=30)).isoformat()},
        timeout=None,
    )
    section = chain_section(root.get(reverse("audit:index")).content.decode())
    assert "data-chain-stale" in section
    assert "Chain intact" in section  # what it found, and that it is old news

    audit_tasks.verify_chain()
    assert "data-chain-stale" not in chain_section(root.get(reverse("audit:index")).content.decode())
