"""A url-mode request is made for one person (the call's on_behalf_of): only they may open its link. Deleting
that user used to set its assignee to null, and the request, link included, fell to their whole team. It ends
instead, as an expiry ends a request (``cancel``), with why in the audit log, and the call goes on."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.audit import core as audit
from approvals.models import AuditEvent, InputRequest, Membership, Round, ToolCall
from approvals.services import escalation
from tests import factories

pytestmark = pytest.mark.django_db

LINK = "https://auth.example.com/device?code=carol-only"


def url_round(*, with_form: bool = False) -> tuple[Any, Any, Round]:
    alice, carol = factories.user("alice"), factories.user("carol")
    release = factories.team("release", (alice, Membership.Role.REVIEWER), (carol, Membership.Role.REVIEWER))
    server = factories.server("deploy", default_team=release)
    call = factories.call(server, on_behalf_of=carol)
    rnd = factories.open_round(call, keys=("environment",) if with_form else (), team_=release)
    InputRequest.objects.create(
        round=rnd,
        key="sign_in",
        mode=InputRequest.Mode.URL,
        message="Sign in",
        url=LINK,
        team=release,
        assignee=carol,
        routing={"assignee": "carol"},  # as routing records the person it was made for
    )
    return alice, carol, rnd


def test_deleting_the_person_a_link_was_made_for_ends_it_instead_of_giving_it_to_the_team() -> None:
    alice, carol, rnd = url_round()
    link = rnd.input_requests.get(key="sign_in")
    reviewer = Client()
    reviewer.force_login(alice)
    assert LINK not in reviewer.get(f"/requests/{link.pk}/").content.decode()

    carol.delete()

    link.refresh_from_db()
    assert link.status == InputRequest.Status.EXPIRED and link.action == InputRequest.Action.CANCEL
    page = reviewer.get(f"/requests/{link.pk}/").content.decode()
    assert LINK not in page
    assert "made for a user since deleted" in page
    assert not InputRequest.objects.pending().filter(pk=link.pk).exists()
    event = AuditEvent.objects.get(verb="input.expired", input_request_id=link.pk)
    assert event.data["reason"] == escalation.ASSIGNEE_DELETED
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.READY and rnd.outcome == Round.Outcome.EXPIRED
    assert ToolCall.objects.get(pk=rnd.call_id).status == ToolCall.Status.RESUMING
    assert audit.verify().ok


def test_the_rest_of_the_round_still_waits_for_the_team() -> None:
    alice, carol, rnd = url_round(with_form=True)

    carol.delete()

    form = rnd.input_requests.get(key="environment")
    assert form.status == InputRequest.Status.PENDING
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.OPEN
    reviewer = Client()
    reviewer.force_login(alice)
    assert reviewer.get(f"/requests/{form.pk}/").status_code == 200


def test_deleting_anyone_else_leaves_the_link_waiting_for_its_person() -> None:
    alice, carol, rnd = url_round()

    alice.delete()

    link = rnd.input_requests.get(key="sign_in")
    assert link.status == InputRequest.Status.PENDING and link.assignee_id == carol.pk
