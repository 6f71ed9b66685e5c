"""Settings fail loudly on bad values; production settings pass Django's deployment checks."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from django.core.checks import run_checks

from elicit_hub import engines
from elicit_hub.settings import development_secret_key
from tests.live import ROOT


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_settings_pass_check_deploy_without_warnings() -> None:
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY="x" * 20 + "-production-secret-value-0123456789abcdef",
        DJANGO_ALLOWED_HOSTS="hub.example.com",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DJANGO_DEBUG": "maybe"}, "DJANGO_DEBUG must be true or false"),
        ({"DJANGO_DEBUG": "false"}, "DJANGO_SECRET_KEY"),
        ({}, "DJANGO_SECRET_KEY"),  # DEBUG is off unless set, so a secret key is required
        ({"DJANGO_DEBUG": "false", "DJANGO_SECRET_KEY": "s" * 50}, "DJANGO_ALLOWED_HOSTS must list"),
        ({"DJANGO_DEBUG": "true", "ELICIT_ROUND_TTL": "soon"}, "ELICIT_ROUND_TTL must be a whole number"),
        (
            {"DJANGO_DEBUG": "true", "ELICIT_EXPIRY_POLICY": "forget"},
            "ELICIT_EXPIRY_POLICY must be cancel or abandon",
        ),
        (
            {
                "DJANGO_DEBUG": "true",
                "DATABASE_URL": "mysql://x@localhost/db",
                "REDIS_URL": "redis://127.0.0.1:6379/0",
            },
            "PostgreSQL",
        ),
        ({"DJANGO_DEBUG": "true", "ELICIT_OUTBOUND_ALLOW": "10.0.0.0/33"}, "ELICIT_OUTBOUND_ALLOW"),
        # Deeper than the audit log records (an accepted body would fail as its event is written).
        ({"DJANGO_DEBUG": "true", "ELICIT_MAX_JSON_DEPTH": "500"}, "must be at most 90"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(env: dict[str, str], message: str) -> None:
    result = manage("check", **env)
    assert result.returncode != 0
    assert message in result.stderr


def test_a_countdown_above_the_visibility_timeout_is_an_error(settings) -> None:
    settings.CELERY_VISIBILITY_TIMEOUT = 100
    settings.ELICIT_WEBHOOK_RETRY_MAX = 600
    settings.ELICIT_MCP_RETRY_MAX = settings.CELERY_TASK_TIME_LIMIT = 30
    settings.ELICIT_CALL_TASK_TIME_LIMIT = 90
    errors = [e for e in run_checks() if e.id == "approvals.E001"]
    assert len(errors) == 1 and "ELICIT_WEBHOOK_RETRY_MAX" in errors[0].msg
    settings.ELICIT_WEBHOOK_RETRY_MAX = 60
    assert not [e for e in run_checks() if e.id == "approvals.E001"]


def test_the_call_task_limit_fits_the_longest_call_and_the_visibility_timeout(settings) -> None:
    from elicit_hub import settings as hub_settings

    # The run_call task may run as long as the longest allowed call, plus its tools/list exchanges.
    assert hub_settings.ELICIT_CALL_TASK_SOFT_TIME_LIMIT > hub_settings.ELICIT_MAX_CALL_TIMEOUT
    limits = hub_settings.CELERY_TASK_ANNOTATIONS["approvals.tasks.run_call"]
    assert limits["time_limit"] > limits["soft_time_limit"] > hub_settings.ELICIT_MAX_CALL_TIMEOUT
    assert not [e for e in run_checks() if e.id == "approvals.E001"]
    settings.ELICIT_CALL_TASK_TIME_LIMIT = settings.CELERY_VISIBILITY_TIMEOUT
    errors = [e for e in run_checks() if e.id == "approvals.E001"]
    assert len(errors) == 1 and "ELICIT_MAX_CALL_TIMEOUT" in errors[0].msg


def test_debug_is_off_unless_set() -> None:
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; print('DEBUG', settings.DEBUG)",
        DJANGO_SECRET_KEY="y" * 20 + "-another-production-secret-0123456789abcdef",
        DJANGO_ALLOWED_HOSTS="hub.example.com",
    )
    assert result.returncode == 0, result.stderr
    assert "DEBUG False" in result.stdout


def test_development_uses_a_private_key_of_its_own_made_once(tmp_path) -> None:
    path = tmp_path / "var" / "secret_key"
    key = development_secret_key(path)
    assert development_secret_key(path) == key == path.read_text().strip()
    assert len(key) >= 50 and "insecure" not in key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert development_secret_key(tmp_path / "elsewhere" / "secret_key") != key
    assert [p.name for p in path.parent.iterdir()] == ["secret_key"]  # no temporary file left behind

    # The hub in development uses this checkout's key from ./var, not a constant.
    show = "from django.conf import settings; print('KEY', settings.SECRET_KEY)"
    result = manage("shell", "-c", show, DJANGO_DEBUG="true")
    assert result.returncode == 0, result.stderr
    assert f"KEY {(engines.VAR_DIR / 'secret_key').read_text().strip()}" in result.stdout


def test_outbound_requests_reach_only_public_addresses_unless_listed() -> None:
    """Production allows no internal address by default; development allows loopback for the demo."""
    script = "from django.conf import settings; print('ALLOW', repr(settings.ELICIT_OUTBOUND_ALLOW))"
    saved = os.environ.pop("ELICIT_OUTBOUND_ALLOW", None)
    try:
        production = manage(
            "shell",
            "-c",
            script,
            DJANGO_SECRET_KEY="z" * 20 + "-a-third-production-secret-0123456789abcdef",
            DJANGO_ALLOWED_HOSTS="hub.example.com",
        )
        development = manage("shell", "-c", script, DJANGO_DEBUG="true")
    finally:
        if saved is not None:
            os.environ["ELICIT_OUTBOUND_ALLOW"] = saved
    assert production.returncode == 0, production.stderr
    assert "ALLOW ''" in production.stdout
    assert "ALLOW '127.0.0.0/8,::1'" in development.stdout


def test_the_test_workers_settings_pass_the_system_checks() -> None:
    from tests.conftest import WORKER_ENV

    # The processes the suite starts (and `migrate` in the outage test) run with these.
    result = manage("check", DJANGO_DEBUG="true", **WORKER_ENV)
    assert result.returncode == 0, result.stderr[-2000:]
