"""The account pages the hub serves: signing in and out and changing one's password. Django's password reset
is not among them: unthrottled, it let anyone make the hub mail any user as often as they liked, with a link
naming the request's host."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

from tests import factories

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path",
    [
        "/accounts/password_reset/",
        "/accounts/password_reset/done/",
        "/accounts/reset/MQ/set-password/",
        "/accounts/reset/done/",
    ],
)
def test_there_is_no_password_reset_and_nothing_is_mailed(path: str) -> None:
    factories.user("alice", email="alice@example.com")
    anonymous = Client()
    assert anonymous.get(path).status_code == 404
    assert anonymous.post(path, {"email": "alice@example.com"}).status_code == 404
    assert mail.outbox == []


def test_the_account_pages_the_hub_uses_still_answer() -> None:
    browser = Client()
    alice = factories.user("alice")
    assert browser.get("/accounts/login/").status_code == 200
    browser.force_login(alice)
    assert browser.get("/accounts/password_change/").status_code == 200
    changed = browser.post(
        "/accounts/password_change/",
        {
            "old_password": "pw-alice",
            "new_password1": "another-long-password-2",
            "new_password2": "another-long-password-2",
        },
    )
    assert changed.status_code == 302 and changed["Location"] == "/accounts/password_change/done/"
    assert browser.get("/accounts/password_change/done/").status_code == 200
    assert browser.post("/accounts/logout/").status_code in (200, 302)
    assert browser.get("/").status_code == 302  # signed out: to the sign-in page
