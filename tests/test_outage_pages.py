"""The dashboard while Redis is down (a Redis address with nothing behind it): a form the hub refuses says
that nothing was done and how to send it again, and never reloads itself (a reload is a GET: it would drop
what the reviewer typed while saying the hub tries again); signing out still works.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.sessions.models import Session
from django.test import Client

from approvals import outage
from tests import factories

pytestmark = pytest.mark.django_db


def test_a_refused_answer_says_it_was_not_sent_and_does_not_reload_itself(redis_down: None) -> None:
    browser = Client()
    browser.force_login(factories.user("alice"))
    response = browser.post(f"/requests/{uuid.uuid4()}/respond/", {"action": "accept", "x": "typed"})

    assert response.status_code == 503
    assert response["Retry-After"] == str(outage.RETRY_AFTER)
    page = response.content.decode()
    assert "Temporarily unavailable" in page
    assert 'http-equiv="refresh"' not in page  # a reload would GET the page: the answer gone, nothing sent
    assert "was not carried out" in page and "send it again" in page
    assert "try again by itself" not in page


def test_signing_out_works_while_redis_is_down(redis_down: None) -> None:
    browser = Client()
    browser.force_login(factories.user("alice"))
    key = browser.session.session_key
    assert Session.objects.filter(session_key=key).exists()

    response = browser.post("/accounts/logout/")

    assert response.status_code in (200, 302), response.content[:300]
    assert not Session.objects.filter(session_key=key).exists()
    assert browser.get("/").status_code == 302  # to the sign-in page


def test_signing_out_of_the_admin_works_while_redis_is_down(redis_down: None) -> None:
    browser = Client()
    browser.force_login(factories.user("root", is_staff=True, is_superuser=True))
    key = browser.session.session_key

    response = browser.post("/admin/logout/")

    assert response.status_code in (200, 302), response.content[:300]
    assert not Session.objects.filter(session_key=key).exists()


def test_other_writes_are_still_refused_while_redis_is_down(redis_down: None) -> None:
    browser = Client()
    browser.force_login(factories.user("alice"))
    assert browser.post("/accounts/logout/extra/").status_code == 503
    api = browser.post("/api/v1/calls", {}, content_type="application/json")
    assert api.status_code == 503 and api.json()["error"]["code"] == "engine_unavailable"
