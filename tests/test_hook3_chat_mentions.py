"""A chat notice mentions no one, whatever the server's question or the team's name holds. Mattermost (which
takes Slack's payload) cuts a post into words at punctuation before it looks for ``@channel``, ``@all`` and
``@here``: an ``@`` right after a full stop, a hyphen, a plus or an underscore starts a mention there as one
after a space does. `mattermost_channel_mentions` reads a text as its server does (its standard mention
parser: split at what cannot be part of a mention, trim ``:.-_`` off the front, split again at ``.-:``)."""

from __future__ import annotations

import re

import pytest

from approvals.models import Notification, Team
from approvals.services import notifications
from tests import factories
from tests.hub import WebhookReceiver
from tests.test_outbound_notices import request_for

CHANNEL_WIDE = {"@here", "@channel", "@all"}


def _kept_in_word(char: str) -> bool:
    return char in ":.-_@" or char.isalpha() or char.isnumeric()


def _channel_wide(word: str) -> str:
    return word.lower() if word.lower() in CHANNEL_WIDE else ""


def mattermost_channel_mentions(text: str) -> set[str]:
    """The channel-wide mentions a Mattermost server finds in `text`."""
    found: set[str] = set()
    words = "".join(char if _kept_in_word(char) else " " for char in text).split()
    for raw in words:
        if raw.startswith(":") and raw.endswith(":"):  # read as an emoji
            continue
        word = raw.lstrip(":.-_")
        found.add(_channel_wide(word))
        stripped = word
        while stripped and stripped[-1] in ".-:_":
            stripped = stripped[:-1]
            found.add(_channel_wide(stripped))
        if not word.startswith("@") and any(mark in word for mark in ".-:"):
            found.update(_channel_wide(part) for part in re.split(r"[.\-:]", word))
    return found - {""}


def discord_channel_mentions(text: str) -> set[str]:
    return {mention for mention in ("@everyone", "@here") if mention in text.lower()}


HOSTILE_WORDS = ["v2.@channel", "x-@all", "+@here", "_@channel", "ok.@All", "(@channel)", "@here"]


@pytest.mark.parametrize("word", HOSTILE_WORDS)
def test_a_mention_right_after_punctuation_pings_no_one(word: str) -> None:
    assert mattermost_channel_mentions(f"Release {word} now")  # the parser reads it as a mention
    text = notifications._chat_text(f"Release {word} now")
    assert mattermost_channel_mentions(text) == set(), text
    assert discord_channel_mentions(text) == set(), text
    assert text.replace("\u2060", "") == f"Release {word} now"  # shown as written


def test_addresses_and_words_with_an_at_inside_are_left_as_written() -> None:
    text = "mail first.last@example.org, a-b+c@deploy.example or é@example.org; v2@channel"
    assert mattermost_channel_mentions(text) == set()
    assert notifications._chat_text(text) == text


@pytest.mark.django_db
def test_a_team_with_odd_characters_in_its_name_gets_a_notice_that_pings_no_one() -> None:
    """The team's name and the server's question reach the chat as written: escaped as Slack asks, with no
    mention, link or brace left to the chat's reading."""
    name = "R&D <ops> {team} 100% [x](y) .@channel"
    with WebhookReceiver() as chat:
        team = factories.team("odd")
        Team.objects.filter(pk=team.pk).update(name=name, chat_webhook_url=chat.url)
        team.refresh_from_db()
        ir = request_for(team, message="Ship v2.@channel? Ask x-@all or +@here first_@channel")
        notifications.notify(ir=ir, team=team, event="routed")
        (notice,) = Notification.objects.filter(team=team)
        assert notifications.notification_send(notification_id=notice.pk) is None

    notice.refresh_from_db()
    assert notice.status == Notification.Status.SENT, notice.last_error
    text = chat.received[0].json()["text"]
    assert mattermost_channel_mentions(text) == set(), text
    assert discord_channel_mentions(text) == set(), text
    assert "R&amp;D &lt;ops&gt; {team} 100% [x]\u2060(y) .@\u2060channel" in text
    assert "Ship v2.@\u2060channel? Ask x-@\u2060all or +@\u2060here first_@\u2060channel" in text
