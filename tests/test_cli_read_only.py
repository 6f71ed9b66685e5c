"""A command whose PostgreSQL takes no writes (a standby reached after a failover) ends as an outage does:
one line naming the engine, exit 3, no traceback, and nothing stored."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings

from approvals.models import PersonalToken
from tests import factories, live
from tests.live import child_env

pytestmark = pytest.mark.timeout(120)


def test_a_command_on_a_read_only_database_says_so_in_one_line_and_exits_3(live_db: None) -> None:
    factories.user("alice")
    read_only = live.read_only_database_url()
    done = subprocess.run(
        [sys.executable, "manage.py", "create_token", "alice"],
        cwd=settings.BASE_DIR,
        env=child_env(DATABASE_URL=read_only, DJANGO_DEBUG="true"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "PostgreSQL (DATABASE_URL)" in done.stderr
    assert not PersonalToken.objects.exists()
