"""Settings an operator gets wrong are refused at start-up with a sentence naming the variable, never accepted
to fail later on every request (or to quietly mean something else), and never repeating a password."""

from __future__ import annotations

import pytest

from tests.test_settings import manage

DEV = {"DJANGO_DEBUG": "true", "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test_opx"}


@pytest.mark.parametrize(
    ("redis_url", "message"),
    [
        ("redis://127.0.0.1:abc/7", "REDIS_URL: the port is not a number"),
        ("redis://127.0.0.1:99999/7", "REDIS_URL: the port is not a number"),
        # redis-py would quietly use database 0: another hub's, or the tests'.
        ("redis://127.0.0.1:6379/seven", "REDIS_URL: the database after the host must be a number"),
        ("unix://", "REDIS_URL: a unix:// URL names the socket's path"),
        ("unix:///run/redis.sock?db=x", "REDIS_URL is not a valid Redis URL"),
    ],
)
def test_a_redis_url_the_clients_cannot_use_is_refused_at_start_up(redis_url: str, message: str) -> None:
    result = manage("check", **DEV, REDIS_URL=redis_url)
    assert result.returncode != 0
    assert message in result.stderr


def test_a_malformed_redis_url_is_refused_without_repeating_its_password() -> None:
    # An unencoded "/" in the password ends the host part: what follows ":" reads as the port.
    result = manage("check", **DEV, REDIS_URL="redis://:hunter2-s3cret/part@redis.internal:6379/0")
    assert result.returncode != 0
    assert "REDIS_URL: the port is not a number" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "redis_url", ["redis://127.0.0.1:6379/7", "redis://:p%2Fw@127.0.0.1:6379/", "rediss://h"]
)
def test_usable_redis_urls_pass(redis_url: str) -> None:
    result = manage("check", **DEV, REDIS_URL=redis_url)
    assert result.returncode == 0, result.stderr[-2000:]


def test_an_unknown_log_level_is_refused_with_a_clear_message_and_any_case_is_read() -> None:
    result = manage("check", **DEV, REDIS_URL="redis://127.0.0.1:6379/7", ELICIT_LOG_LEVEL="verbose")
    assert result.returncode != 0
    assert "ELICIT_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL" in result.stderr
    assert "Unable to configure root logger" not in result.stderr

    show = "import logging; print('LEVEL', logging.getLevelName(logging.getLogger().level))"
    result = manage(
        "shell", "-c", show, **DEV, REDIS_URL="redis://127.0.0.1:6379/7", ELICIT_LOG_LEVEL="warning"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "LEVEL WARNING" in result.stdout


@pytest.mark.parametrize(
    "public_url", ["hub.example.com", "https://hub.example.com:port", "ftp://hub", "http://[::1"]
)
def test_a_public_url_links_could_not_start_with_is_refused(public_url: str) -> None:
    result = manage("check", **DEV, REDIS_URL="redis://127.0.0.1:6379/7", ELICIT_PUBLIC_URL=public_url)
    assert result.returncode != 0
    assert "ELICIT_PUBLIC_URL must be the address reviewers open the dashboard at" in result.stderr


def test_a_public_url_with_a_path_is_read() -> None:
    show = "from django.conf import settings; print('URL', settings.ELICIT_PUBLIC_URL)"
    result = manage(
        "shell",
        "-c",
        show,
        **DEV,
        REDIS_URL="redis://127.0.0.1:6379/7",
        ELICIT_PUBLIC_URL="https://example.org/hub",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "URL https://example.org/hub" in result.stdout
