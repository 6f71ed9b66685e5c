"""A rate limit's setting the API's limiter cannot read stops the hub at start-up with a sentence naming it:
before, the API's URLs raised ninja's "Invalid rate format" in a traceback as they were imported (in every web
process, and in `manage.py check` before its own check could say which setting it was)."""

from __future__ import annotations

import pytest

from tests.test_settings import manage

DEV = {
    "DJANGO_DEBUG": "true",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test_edge3",
    "REDIS_URL": "redis://127.0.0.1:6379/10",
}


@pytest.mark.parametrize(
    ("name", "value"),
    [("ELICIT_API_RATE", "abc"), ("ELICIT_API_ANON_RATE", "0/m"), ("ELICIT_SIGN_IN_USER_RATE", "5")],
)
def test_an_unreadable_rate_is_refused_at_start_up_naming_the_setting(name: str, value: str) -> None:
    result = manage("check", **DEV, **{name: value})
    assert result.returncode != 0
    assert f'{name} must be a rate written "count/period"' in result.stderr, result.stderr[-2000:]
    assert "Invalid rate format" not in result.stderr


def test_a_readable_rate_starts() -> None:
    result = manage("check", **DEV, ELICIT_API_RATE="100/hour", ELICIT_API_ANON_RATE="5/15m")
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("value", "read"),
    [
        ("600/m", (600, 60)),
        ("5/15m", (5, 900)),
        ("100/hour", (100, 3600)),
        ("10/30", (10, 30)),
        ("1/d", (1, 86400)),
        ("abc", None),
        ("5", None),
        ("0/m", None),
        ("5/0m", None),
        ("5/ms", None),
        ("-1/m", None),
        ("5/m/", None),
    ],
)
def test_a_rate_is_read_as_the_api_s_limiter_reads_it(value: str, read: tuple[int, int] | None) -> None:
    from ninja.throttling import SimpleRateThrottle

    from elicit_hub.settings import rate_of

    assert rate_of(value) == read
    if read is not None:
        assert SimpleRateThrottle(value).parse_rate(value) == read
