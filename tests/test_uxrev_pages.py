"""The reviewer's pages outside the answer form: the queue's states (empty, filtered), and what a reviewer
of one team can learn of another team's requests, calls and grants (nothing: each answers as if it did not
exist)."""

from __future__ import annotations

import re
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client

from approvals.models import Membership
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> Any:
    alice, olga = factories.user("alice"), factories.user("olga")
    release = factories.team("release", (alice, Membership.Role.REVIEWER))
    ops = factories.team("ops", (olga, Membership.Role.REVIEWER))
    deploy = factories.server("deploy", name="Deploy bot", default_team=release)
    pager = factories.server("pager", name="Pager", default_team=ops)
    return SimpleNamespace(**locals())


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def waiting(world: Any, server: Any = None, team: Any = None, tool: str = "create_deployment") -> Any:
    call = factories.call(server or world.deploy, tool=tool)
    return factories.open_round(call, team_=team or world.release).input_requests.get()


def selected(page: str, name: str) -> str | None:
    select = re.search(rf'<select name="{name}">(.*?)</select>', page, re.S)
    assert select is not None
    chosen = re.search(r'<option value="([^"]*)"[^>]* selected>', select.group(1))
    return chosen.group(1) if chosen else None


def test_a_filter_matching_nothing_says_so_and_how_many_wait_without_it(world) -> None:
    waiting(world)
    waiting(world, tool="rollback")
    client = signed_in(world.alice)
    page = client.get("/?server=deploy&tool=wipe").content.decode()
    assert "Nothing is waiting for you" not in page
    assert "Nothing waiting matches these filters." in page and "2 requests wait without them." in page
    assert 'href="/" data-clear-filters' in page
    # The form says what the list is filtered by, though nothing of that tool waits now.
    assert selected(page, "server") == "deploy" and selected(page, "tool") == "wipe"
    # The list the page fetches to resync says the same.
    fragment = client.get("/queue/list/?tool=wipe").content.decode()
    assert "data-empty-filtered" in fragment and "2 requests wait without them." in fragment


def test_an_empty_queue_without_filters_says_nothing_waits(world) -> None:
    page = signed_in(world.alice).get("/").content.decode()
    assert "Nothing is waiting for you" in page and "data-empty-filtered" not in page
    # Another team's requests count for nothing here, filtered or not.
    waiting(world, server=world.pager, team=world.ops)
    page = signed_in(world.alice).get("/?server=pager").content.decode()
    assert "Nothing waiting matches these filters." in page and "without them" not in page


def test_a_filter_matching_something_shows_it_and_no_empty_state(world) -> None:
    waiting(world)
    page = signed_in(world.alice).get("/?tool=create_deployment").content.decode()
    assert "data-empty" not in page and "data-pending-request" in page
    assert selected(page, "tool") == "create_deployment"


# --- what one team learns of another's ----------------------------------------------------------------------


def made_grant(world: Any) -> Any:
    from approvals.services import grants

    agent, _token = factories.agent("ci-bot", servers=[world.pager])
    call = factories.call(world.pager, agent)
    return grants.create_from_approval(
        approver=world.olga, call=call, tool_digest="d" * 64, choice={"for": "8h", "arguments": "exact"}
    )


def answers(client: Client, method: str, url: str) -> tuple[int, str]:
    """The status and the page, without what differs on every page (the script nonce, the CSRF token)."""
    response = getattr(client, method)(url)
    page = re.sub(r'(nonce|value)="[^"]*"', r'\1=""', response.content.decode())
    return response.status_code, page


def test_another_teams_request_call_and_grant_answer_as_if_they_did_not_exist(world) -> None:
    theirs = waiting(world, server=world.pager, team=world.ops)
    grant = made_grant(world)
    client = signed_in(world.alice)
    nobody = uuid.uuid4()
    pages = [
        ("get", "/requests/{}/"),
        ("get", "/requests/{}/state/"),
        ("post", "/requests/{}/respond/"),
        ("post", "/requests/{}/decide/"),
        ("post", "/requests/{}/open/"),
        ("post", "/requests/{}/extend/"),
        ("post", "/requests/{}/presence/"),
    ]
    for method, url in pages:
        assert answers(client, method, url.format(theirs.pk)) == answers(client, method, url.format(nobody))
    for url in ("/calls/{}/", "/calls/{}/body/", "/calls/{}/routing/"):
        mine, none = (
            answers(client, "get", url.format(theirs.round.call_id)),
            answers(client, "get", url.format(nobody)),
        )
        assert mine == none and mine[0] == 404
    for method in ("get", "post"):
        url = "/grants/{}/revoke/"
        assert answers(client, method, url.format(grant.pk)) == answers(client, method, url.format(nobody))
    # Filtering by the other team's slug, server or tool shows what filtering by nothing that exists shows.
    for name, value in (("team", "ops"), ("team", "nosuch")):
        page = client.get(f"/grants/?{name}={value}").content.decode()
        assert "No grant matches these filters." in page and "Pager" not in page
    assert client.get("/queue/count/?server=pager").json() == client.get("/queue/count/?server=nosuch").json()


def test_the_grants_pages_are_not_kept_by_the_browser(world) -> None:
    grant = made_grant(world)
    client = signed_in(world.olga)
    for url in ("/grants/", f"/grants/{grant.pk}/revoke/"):
        response = client.get(url)
        assert response.status_code == 200
        assert "no-store" in response["Cache-Control"], url
    response = client.post(f"/grants/{grant.pk}/revoke/")
    assert response.status_code == 302
    again = client.post(f"/grants/{grant.pk}/revoke/")  # a second revoke, from a page kept anyway
    assert again.status_code == 409 and "no-store" in again["Cache-Control"]


def test_the_recent_page_says_when_it_shows_only_the_latest_calls(world, monkeypatch) -> None:
    from django.utils import timezone

    from approvals import views

    monkeypatch.setattr(views, "RECENT_MAX", 2)
    for tool in ("one", "two", "three"):
        factories.call(
            world.deploy,
            tool=tool,
            status="completed",
            result={"content": [], "isError": False},
            finished_at=timezone.now(),
        )
    factories.call(
        world.pager,
        tool="theirs",
        status="completed",
        result={"content": [], "isError": False},
        finished_at=timezone.now(),
    )
    page = signed_in(world.alice).get("/recent/").content.decode()
    assert page.count("<tr data-call=") == 2 and "data-recent-more" in page and "Only the 2 that" in page
    monkeypatch.setattr(views, "RECENT_MAX", 3)  # exactly as many as finished: nothing is left out
    page = signed_in(world.alice).get("/recent/").content.decode()
    assert page.count("<tr data-call=") == 3 and "data-recent-more" not in page and "theirs" not in page
